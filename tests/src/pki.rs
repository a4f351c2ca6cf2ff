//! Certificates for TLS tests: a test CA and a leaf it signed for 127.0.0.1 and localhost,
//! made with the openssl CLI (the leaf is what a node serves; clients trust the CA, as they
//! would an operator's CA: webpki refuses a self-signed CA certificate used as the leaf).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The PEM files of a test PKI.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// Makes the CA, the leaf and its key in `dir`.
    pub fn make(dir: &Path) -> Pki {
        let p = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl is installed");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509"];
        ca.extend_from_slice(&ec);
        ca.extend_from_slice(&[
            "-days",
            "1",
            "-subj",
            "/CN=yutu-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&ca);
        let mut csr = vec!["req"];
        csr.extend_from_slice(&ec);
        csr.extend_from_slice(&[
            "-subj",
            "/CN=localhost",
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
        ]);
        openssl(&csr);
        std::fs::write(
            p("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "leaf.ext",
            "-out",
            "cert.pem",
        ]);
        Pki {
            ca: p("ca.pem"),
            cert: p("cert.pem"),
            key: p("key.pem"),
        }
    }
}
