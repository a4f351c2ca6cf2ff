//! Abandoned multipart uploads are aborted after the configured timeout and their parts freed.

use std::time::Duration;

use yutu_tests::server::wait_until;
use yutu_tests::{xml, Server};

#[test]
fn abandoned_uploads_are_reaped() {
    let server = Server::start(&["--memory", "64MiB", "--multipart-timeout-secs", "1"]);
    let c = server.client();
    c.mb("mpu");
    let r = c.send("POST", "/mpu/big?uploads", &[], Some(b""));
    assert_eq!(r.status, 200, "{}", r.text());
    let id = xml::values(&r.text(), "UploadId").remove(0);
    let part = vec![7u8; 1 << 20];
    let r = c.put(&format!("/mpu/big?partNumber=1&uploadId={id}"), &part);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(server.metric_sum("yutu_dram_used_bytes") >= (1 << 20) as f64);
    assert_eq!(
        xml::values(&c.get("/mpu?uploads").text(), "UploadId"),
        std::slice::from_ref(&id)
    );
    // The reaper runs about once a second; give it a generous deadline.
    assert!(
        wait_until(Duration::from_secs(20), || xml::values(
            &c.get("/mpu?uploads").text(),
            "UploadId"
        )
        .is_empty()),
        "the abandoned upload was not reaped"
    );
    assert_eq!(server.metric_sum("yutu_dram_used_bytes"), 0.0);
    let r = c.send("POST", &format!("/mpu/big?uploadId={id}"), &[], Some(b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>"));
    assert_eq!((r.status, r.code().as_deref()), (404, Some("NoSuchUpload")));
}
