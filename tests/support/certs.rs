//! Test certificates made with the `openssl` command (which the test script
//! installs): a test CA and server certificates for `localhost`/127.0.0.1 it signs.
//! Shared by the TLS tests of several crates, which include this file with
//! `#[path = ...] mod certs;`.

use std::path::Path;
use std::process::Command;

pub fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the tests make their TLS certificates with it)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A test CA in `dir` (`<ca>.crt`, `<ca>.key`), generated once per name.
pub fn ca(dir: &Path, ca: &str) -> Vec<u8> {
    if !dir.join(format!("{ca}.crt")).exists() {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                &format!("/CN={ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
            ],
        );
    }
    std::fs::read(dir.join(format!("{ca}.crt"))).unwrap()
}

/// A server certificate for `localhost`/127.0.0.1 signed by `ca`, written as
/// `<name>.crt`/`<name>.key`; returns the leaf's DER.
pub fn leaf(dir: &Path, ca_name: &str, name: &str) -> Vec<u8> {
    ca(dir, ca_name);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca_name}.crt"),
            "-CAkey",
            &format!("{ca_name}.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            &format!("{name}.crt"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-in",
            &format!("{name}.crt"),
            "-outform",
            "DER",
            "-out",
            &format!("{name}.der"),
        ],
    );
    std::fs::read(dir.join(format!("{name}.der"))).unwrap()
}
