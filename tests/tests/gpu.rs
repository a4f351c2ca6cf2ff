//! KV blocks into and out of a real GPU, through the node: put from host, get into GPU
//! memory, copy back, byte-exact; put from GPU memory, get into host. On a host without a
//! CUDA driver (or without a GPU) each test says so and passes without checking anything:
//! the same paths are checked on the host-memory device in `kv_device.rs`.

use std::sync::Arc;

use yutu_client::kv::{Device, DeviceBuffer, KvClient, KvOptions};
use yutu_tests::{pattern, Server};
use yutu_transfer::device::open_cuda;

/// Device 0, or `None` after printing why the test is skipped.
fn gpu(test: &str) -> Option<Arc<dyn Device>> {
    match open_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("{test}: skipped, no CUDA GPU here: {e}");
            None
        }
    }
}

const LENS: [u64; 4] = [4 << 10, 2 << 20, 16 << 20, (1 << 20) + 5];

fn setup(dev: &Arc<dyn Device>) -> (Server, KvClient, DeviceBuffer, Vec<u64>, Vec<Vec<u8>>) {
    let server = Server::start(&["--memory", "512MiB", "--max-object-size", "64MiB"]);
    assert_eq!(server.client().put("/gpu", b"").status, 200);
    let kv = KvClient::new(&server.url, KvOptions::default()).expect("client");
    let mut offsets = Vec::new();
    let mut at = 0;
    for l in LENS {
        offsets.push(at);
        at += l.next_multiple_of(4096);
    }
    let mem = dev.alloc(at).expect("GPU memory");
    // SAFETY: `mem` was just allocated on `dev` and is never freed while the test runs.
    let buf = unsafe { kv.register_device(dev.clone(), mem) }.expect("register GPU memory");
    let data = LENS
        .iter()
        .enumerate()
        .map(|(i, &l)| pattern(l as usize, 900 + i as u64))
        .collect();
    (server, kv, buf, offsets, data)
}

#[test]
fn put_from_host_then_get_into_gpu_and_copy_back() {
    let Some(dev) = gpu("put_from_host_then_get_into_gpu_and_copy_back") else {
        return;
    };
    let (_server, kv, gpu_buf, offsets, data) = setup(&dev);
    let keys: Vec<String> = (0..LENS.len()).map(|i| format!("h2g-{i}")).collect();
    let host = kv.register(gpu_buf.len()).expect("host buffer");
    for (i, d) in data.iter().enumerate() {
        host.write_at(offsets[i], d).unwrap();
    }
    kv.batch_put_from("gpu", &keys, &host, &offsets, &LENS)
        .expect("put from host");
    let copied = kv
        .batch_get_into("gpu", &keys, &gpu_buf, &offsets)
        .expect("get into GPU");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(copied[i], Some(LENS[i]));
        let mut back = vec![0u8; d.len()];
        dev.download(gpu_buf.memory(), offsets[i], &mut back)
            .unwrap();
        assert!(back == *d, "block {i} differs after the GPU round trip");
    }
}

#[test]
fn put_from_gpu_then_get_into_host() {
    let Some(dev) = gpu("put_from_gpu_then_get_into_host") else {
        return;
    };
    let (_server, kv, gpu_buf, offsets, data) = setup(&dev);
    let keys: Vec<String> = (0..LENS.len()).map(|i| format!("g2h-{i}")).collect();
    for (i, d) in data.iter().enumerate() {
        dev.upload(gpu_buf.memory(), offsets[i], d).unwrap();
    }
    kv.batch_put_from("gpu", &keys, &gpu_buf, &offsets, &LENS)
        .expect("put from GPU");
    let host = kv.register(gpu_buf.len()).expect("host buffer");
    let copied = kv
        .batch_get_into("gpu", &keys, &host, &offsets)
        .expect("get into host");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(copied[i], Some(LENS[i]));
        let mut back = vec![0u8; d.len()];
        host.read_at(offsets[i], &mut back).unwrap();
        assert!(back == *d, "block {i} differs");
    }
}

#[test]
fn without_a_driver_opening_a_gpu_says_so() {
    // On this kind of host the error must be the typed "no CUDA driver", not a panic from
    // the loader; on a GPU host the device opens.
    match open_cuda(0) {
        Ok(d) => assert!(d.name().starts_with("cuda:0")),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("no CUDA driver") || msg.contains("no device"),
                "{msg}"
            );
        }
    }
}
