//! A private CA made at test time with `openssl`: certificates for a server on 127.0.0.1 and
//! for its clients, written into a directory as `<name>.pem` and `<name>.key`.

use std::path::Path;
use std::process::Command;

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA,
/// written into `dir` as `<name>.pem` and `<name>.key`.
pub fn make_certificates(dir: &Path) {
    let openssl = |args: &[&str]| openssl(dir, args);
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=statsd-redis test CA",
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for name in ["server", "client"] {
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={name}"),
                ],
            ]
            .concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
    }
}

/// A client certificate no CA of the tests signed (self-signed), as `stranger.pem` and
/// `stranger.key`: what a client of another organisation would present.
pub fn make_stranger(dir: &Path) {
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
            "-keyout",
            "stranger.key",
            "-out",
            "stranger.pem",
            "-days",
            "2",
            "-subj",
            "/CN=stranger",
        ],
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    super::run_ok(
        Command::new("openssl").args(args).current_dir(dir),
        &format!("openssl {args:?} (the TLS tests need it: apt-get install -y openssl)"),
    );
}
