//! The `yutu` CLI against a node with users (authentication on, no `--no-auth`): keys from
//! the environment, from a credentials-file profile and from flags; a wrong secret prints
//! the S3 error and exits 1.

use std::path::Path;
use std::process::{Command, Output};

use yutu_tests::users::node_with_config;
use yutu_tests::{bin_path, pattern, Server};

const USERS: &str = r#"
[[users]]
name = "carol"
access_key = "CAROLKEY"
secret_key = "carol-secret-key"
"#;

fn start() -> Server {
    node_with_config(USERS, &["--memory", "64MiB", "--nvme-capacity", "64MiB"])
}

/// `yutu` with no credentials in its environment but those given in `env`.
fn yutu(server: &Server, home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(bin_path("yutu"));
    cmd.arg("--url").arg(&server.url).args(args);
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_SESSION_TOKEN",
        "YUTU_URL",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home).envs(env.iter().copied());
    cmd.output().expect("run yutu")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// mb, put, ls, get and rm, signed however `env` and `flags` say.
fn round_trip(server: &Server, home: &Path, env: &[(&str, &str)], flags: &[&str], bucket: &str) {
    let file = home.join("in.bin");
    let data = pattern(3 << 20, bucket.len() as u64);
    std::fs::write(&file, &data).expect("write");
    let run = |args: &[&str]| {
        let all: Vec<&str> = flags.iter().chain(args).copied().collect();
        ok(yutu(server, home, env, &all), &format!("yutu {all:?}"))
    };
    run(&["mb", bucket]);
    // A key with characters that SigV4 encodes in the canonical URI.
    let key = "dir/a b+c&d=é~(1).bin";
    let target = format!("{bucket}/{key}");
    run(&["put", file.to_str().expect("utf-8 path"), &target]);
    assert!(run(&["ls", bucket, "--recursive"]).contains(key));
    // A listing's query (prefix, delimiter) is signed too.
    assert!(run(&["ls", &format!("{bucket}/dir/a b")]).contains(key));
    assert!(run(&["stat", &target]).contains("3145728"));
    let back = home.join("out.bin");
    run(&["get", &target, back.to_str().expect("utf-8 path")]);
    assert!(std::fs::read(&back).expect("read back") == data);
    run(&["rm", &target]);
    run(&["rb", bucket]);
}

#[test]
fn cli_signs_with_keys_from_env_profile_and_flags() {
    let home = tempfile::tempdir().expect("temp dir");
    let server = start();

    // Unsigned requests are refused by a node with users.
    let out = yutu(&server, home.path(), &[], &["ls"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("AccessDenied"));

    let env = [
        ("AWS_ACCESS_KEY_ID", "CAROLKEY"),
        ("AWS_SECRET_ACCESS_KEY", "carol-secret-key"),
    ];
    round_trip(&server, home.path(), &env, &[], "from-env");

    let aws = home.path().join(".aws");
    std::fs::create_dir_all(&aws).expect("mkdir");
    std::fs::write(
        aws.join("credentials"),
        "[default]\naws_access_key_id = NOBODY\naws_secret_access_key = nothing-here\n\n\
         [carol]\naws_access_key_id = CAROLKEY\naws_secret_access_key = carol-secret-key\n",
    )
    .expect("credentials file");
    round_trip(
        &server,
        home.path(),
        &[("AWS_PROFILE", "carol")],
        &[],
        "from-profile",
    );
    // AWS_SHARED_CREDENTIALS_FILE instead of ~/.aws/credentials, its default profile.
    let elsewhere = home.path().join("elsewhere");
    std::fs::write(
        &elsewhere,
        "[default]\naws_access_key_id=CAROLKEY\naws_secret_access_key=carol-secret-key\n",
    )
    .expect("credentials file");
    round_trip(
        &server,
        home.path(),
        &[(
            "AWS_SHARED_CREDENTIALS_FILE",
            elsewhere.to_str().expect("utf-8 path"),
        )],
        &[],
        "from-shared-file",
    );
    // Flags win over the environment (whose key is unknown) and the default profile.
    round_trip(
        &server,
        home.path(),
        &[
            ("AWS_ACCESS_KEY_ID", "NOBODY"),
            ("AWS_SECRET_ACCESS_KEY", "nothing-here"),
        ],
        &[
            "--access-key",
            "CAROLKEY",
            "--secret-key",
            "carol-secret-key",
        ],
        "from-flags",
    );

    // The default profile holds an unknown key; a wrong secret is SignatureDoesNotMatch.
    let out = yutu(&server, home.path(), &[], &["ls"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("InvalidAccessKeyId"));
    let wrong = [
        ("AWS_ACCESS_KEY_ID", "CAROLKEY"),
        ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
    ];
    for args in [&["mb", "never"][..], &["ls"], &["get", "from-env/x", "-"]] {
        let out = yutu(&server, home.path(), &wrong, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        // `yutu: CODE: message`, the message the node sent.
        let message = err
            .trim_end()
            .strip_prefix("yutu: SignatureDoesNotMatch: ")
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        assert!(message.contains("signature"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // The environment wins over the profile file.
    let out = yutu(&server, home.path(), &wrong, &["ls"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("SignatureDoesNotMatch"));
    let out = yutu(&server, home.path(), &[("AWS_PROFILE", "carol")], &["ls"]);
    assert!(out.status.success());
}
