//! Phase 2 by equivalence for certificates, against the real `haproxy -c` (the one
//! on PATH; scripts/test.sh runs this file on every supported line):
//!
//! - differential: random candidates that add, renew and remove certificates and
//!   crt-list lines, with valid PEMs and broken ones (mismatched keys, garbage,
//!   truncation, extra blocks, DH parameters, encrypted keys, unusual key types,
//!   SHA-1 signatures, foreign chains, odd line endings) and random SNI filters and
//!   options; whenever the rule accepts a candidate, `haproxy -c` must accept it too;
//! - the validation service passes a new certificate by equivalence (reason
//!   `certificates`, no `haproxy -c`), and a PEM HAProxy refuses is still refused
//!   with HAProxy's message, without the key in it.
//!
//! The random test prints its seed on failure; set `HAPWRIGHT_CERT_EQUIVALENCE_SEED`
//! to replay one.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use hapwright_deployer::component::validator::equivalence::{
    self, Baseline, Equivalence, SkipReason,
};
use hapwright_deployer::component::validator::{self, Service};
use hapwright_eventbus::model::{RenderedConfig, SourceMap};
use support::random::{Draw, seed};
use support::validator_settings as settings;

/// Candidates drawn by the differential test.
const CANDIDATES: usize = 160;

// === PEMs made with openssl ===

/// Runs openssl with the blank-separated `args` in `dir`; panics when it fails.
fn openssl(dir: &Path, args: &str) {
    let status = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args}");
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Keys and certificates of many kinds, by name.
struct Pool {
    /// `NAME.key` (PKCS#8) and `NAME.crt` of each self-signed kind.
    pems: BTreeMap<&'static str, (String, String)>,
    /// The CA certificate (P-256) that signed `leaf`.
    ca: String,
    /// Another CA, never served.
    foreign_ca: String,
    /// Traditional (PKCS#1) RSA and SEC1 EC forms of `rsa2048` and `ec256`.
    rsa_traditional: String,
    ec_sec1: String,
    /// `ec256`'s key, encrypted.
    encrypted: String,
    /// DH parameters.
    dh: String,
    /// EC parameters block, as `openssl ecparam -genkey` writes before a SEC1 key.
    ec_parameters: String,
}

/// Self-signed kinds: algorithm, key option and digest.
const KINDS: &[(&str, &str, &str, &str)] = &[
    ("ec256", "EC", "ec_paramgen_curve:P-256", "-sha256"),
    ("ec256b", "EC", "ec_paramgen_curve:P-256", "-sha256"),
    ("ec384", "EC", "ec_paramgen_curve:P-384", "-sha384"),
    ("ec521", "EC", "ec_paramgen_curve:P-521", "-sha512"),
    ("rsa2048", "RSA", "rsa_keygen_bits:2048", "-sha256"),
    ("rsa1024", "RSA", "rsa_keygen_bits:1024", "-sha256"),
    ("ed25519", "ED25519", "", ""),
    // A leaf signed with SHA-1 (OpenSSL refuses it as a CA digest at security
    // level 1 and above, but not for a self-signed certificate).
    ("sha1", "EC", "ec_paramgen_curve:P-256", "-sha1"),
];

impl Pool {
    fn new(dir: &Path) -> Self {
        let mut pems = BTreeMap::new();
        for (name, algorithm, option, digest) in KINDS {
            let option = if option.is_empty() {
                String::new()
            } else {
                format!("-pkeyopt {option}")
            };
            openssl(
                dir,
                &format!("genpkey -algorithm {algorithm} {option} -out {name}.key"),
            );
            openssl(
                dir,
                &format!(
                    "req -x509 -key {name}.key -subj /CN={name}.test -days 30 {digest} -out {name}.crt"
                ),
            );
            pems.insert(
                *name,
                (
                    read(dir, &format!("{name}.crt")),
                    read(dir, &format!("{name}.key")),
                ),
            );
        }
        // An expired certificate: valid from 2000 to 2001 (HAProxy accepts it).
        std::fs::write(
            dir.join("ca.cnf"),
            "[ca]\ndefault_ca = here\n[here]\ndatabase = index.txt\nnew_certs_dir = .\n\
             serial = serial\ndefault_md = sha256\npolicy = any\nx509_extensions = ext\n\
             [any]\ncommonName = supplied\n[ext]\nsubjectAltName = DNS:expired.test\n",
        )
        .unwrap();
        std::fs::write(dir.join("index.txt"), "").unwrap();
        std::fs::write(dir.join("serial"), "01\n").unwrap();
        openssl(
            dir,
            "req -new -key ec256.key -subj /CN=expired.test -out expired.csr",
        );
        openssl(
            dir,
            "ca -config ca.cnf -batch -selfsign -keyfile ec256.key -in expired.csr \
             -startdate 20000101000000Z -enddate 20010101000000Z -notext -out expired.crt",
        );
        // CAs and a leaf the first signs (v3, SHA-256), and one it signs with SHA-1.
        for name in ["ca", "foreign", "leaf"] {
            openssl(
                dir,
                &format!("genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out {name}.key"),
            );
        }
        for ca in ["ca", "foreign"] {
            openssl(
                dir,
                &format!(
                    "req -x509 -key {ca}.key -subj /CN={ca}-CA -days 30 -sha256 -out {ca}.crt"
                ),
            );
        }
        openssl(
            dir,
            "req -new -key leaf.key -subj /CN=leaf.test -out leaf.csr",
        );
        std::fs::write(dir.join("v3.ext"), "subjectAltName=DNS:leaf.test\n").unwrap();
        for (out, ca, digest) in [
            ("leaf.crt", "ca", "-sha256"),
            ("leaf-sha1.crt", "ca", "-sha1"),
            ("leaf-foreign.crt", "foreign", "-sha256"),
        ] {
            openssl(
                dir,
                &format!(
                    "x509 -req -in leaf.csr -CA {ca}.crt -CAkey {ca}.key -set_serial 2 -days 30 \
                     {digest} -extfile v3.ext -out {out}"
                ),
            );
        }
        pems.insert("leaf", (read(dir, "leaf.crt"), read(dir, "leaf.key")));
        pems.insert(
            "leaf-sha1",
            (read(dir, "leaf-sha1.crt"), read(dir, "leaf.key")),
        );
        pems.insert(
            "leaf-foreign",
            (read(dir, "leaf-foreign.crt"), read(dir, "leaf.key")),
        );
        pems.insert(
            "expired",
            (read(dir, "expired.crt"), read(dir, "ec256.key")),
        );
        openssl(dir, "pkey -in rsa2048.key -traditional -out rsa2048.pkcs1");
        openssl(dir, "ec -in ec256.key -out ec256.sec1");
        openssl(
            dir,
            "pkcs8 -topk8 -in ec256.key -v2 aes-256-cbc -passout pass:secret -out ec256.encrypted",
        );
        openssl(
            dir,
            "genpkey -genparam -algorithm DH -pkeyopt group:ffdhe2048 -out dh.pem",
        );
        openssl(dir, "ecparam -name prime256v1 -out ec.param");
        Self {
            pems,
            ca: read(dir, "ca.crt"),
            foreign_ca: read(dir, "foreign.crt"),
            rsa_traditional: read(dir, "rsa2048.pkcs1"),
            ec_sec1: read(dir, "ec256.sec1"),
            encrypted: read(dir, "ec256.encrypted"),
            dh: read(dir, "dh.pem"),
            ec_parameters: read(dir, "ec.param"),
        }
    }

    /// Certificate then key of `kind`.
    fn valid(&self, kind: &str) -> String {
        let (crt, key) = &self.pems[kind];
        format!("{crt}{key}")
    }
}

/// What a PEM variant is: `true` when it is well formed and HAProxy should load
/// it, as far as the test knows (only for the report; the assertion is
/// the differential one).
fn pem_variant(pool: &Pool, draw: &mut Draw) -> (String, String) {
    let kinds: Vec<&str> = pool.pems.keys().copied().collect();
    let kind = kinds[draw.below(kinds.len())];
    let (crt, key) = &pool.pems[kind];
    let other = &pool.pems[kinds[draw.below(kinds.len())]].1;
    let valid = format!("{crt}{key}");
    let (what, pem) = match draw.below(20) {
        0..=5 => ("valid", valid),
        6 => ("key first", format!("{key}{crt}")),
        7 => ("mismatched key", format!("{crt}{other}")),
        8 => ("garbage", garbage(draw)),
        9 => {
            let cut = draw.below(valid.len());
            ("truncated", valid[..cut].to_owned())
        }
        10 => match draw.below(3) {
            0 => ("with dh params", format!("{valid}{}", pool.dh)),
            1 => ("with a second key", format!("{valid}{other}")),
            _ => (
                "with ec parameters",
                format!("{crt}{}{}", pool.ec_parameters, pool.ec_sec1),
            ),
        },
        11 => ("encrypted key", format!("{crt}{}", pool.encrypted)),
        12 => match draw.below(2) {
            0 => (
                "pkcs1 key",
                format!("{}{}", pool.pems["rsa2048"].0, pool.rsa_traditional),
            ),
            _ => (
                "sec1 key",
                format!("{}{}", pool.pems["ec256"].0, pool.ec_sec1),
            ),
        },
        13 => match draw.below(3) {
            0 => (
                "chain",
                format!("{}{}{}", pool.pems["leaf"].0, pool.ca, pool.pems["leaf"].1),
            ),
            1 => (
                "foreign chain",
                format!(
                    "{}{}{}",
                    pool.pems["leaf-foreign"].0, pool.foreign_ca, pool.pems["leaf"].1
                ),
            ),
            _ => ("leaf without chain", pool.valid("leaf")),
        },
        14 => ("crlf", valid.replace('\n', "\r\n")),
        15 => ("no final newline", valid.trim_end().to_owned()),
        16 => ("long lines", rewrap(&valid, 100)),
        17 => ("blank line in a block", valid.replacen("\n", "\n\n", 3)),
        18 => (
            "text before",
            format!("Bag Attributes\n    friendlyName: x\n{valid}"),
        ),
        _ => ("duplicate certificate", format!("{crt}{crt}{key}")),
    };
    (format!("{what} ({kind})"), pem)
}

/// Random printable and PEM-like text.
fn garbage(draw: &mut Draw) -> String {
    let pieces = [
        "-----BEGIN CERTIFICATE-----\n",
        "-----END CERTIFICATE-----\n",
        "-----BEGIN PRIVATE KEY-----\n",
        "-----END PRIVATE KEY-----\n",
        "MIIB",
        "AAAA\n",
        "====\n",
        "garbage\n",
        "\n",
    ];
    (0..draw.below(12))
        .map(|_| pieces[draw.below(pieces.len())])
        .collect()
}

/// The PEM with every base64 run joined and cut into lines of `width`.
fn rewrap(pem: &str, width: usize) -> String {
    let mut out = String::new();
    let mut body = String::new();
    for line in pem.lines() {
        if line.starts_with("-----") {
            for chunk in body.as_bytes().chunks(width) {
                out.push_str(std::str::from_utf8(chunk).unwrap());
                out.push('\n');
            }
            body.clear();
            out.push_str(line);
            out.push('\n');
        } else {
            body.push_str(line);
        }
    }
    out
}

// === renders ===

/// A render as data: crt-list lines and certificates.
#[derive(Clone, Debug)]
struct Render {
    lines: Vec<String>,
    certs: BTreeMap<String, String>,
}

fn main_config() -> String {
    "global\n    stats timeout 30s\n\n\
defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n    timeout server 10s\n\n\
frontend fe_tls\n    bind 127.0.0.1:8443 ssl crt-list files/tls.crtlist alpn h2,http/1.1\n    \
http-request return status 200 content-type text/plain string ok\n"
        .to_owned()
}

impl Render {
    fn rendered(&self) -> Arc<RenderedConfig> {
        let list: String = self.lines.iter().map(|l| format!("{l}\n")).collect();
        Arc::new(RenderedConfig::new(
            main_config(),
            BTreeMap::new(),
            [("tls.crtlist".to_owned(), Arc::<str>::from(list))].into(),
            self.certs
                .iter()
                .map(|(name, pem)| (name.clone(), Arc::<str>::from(pem.as_str())))
                .collect(),
            SourceMap::default(),
        ))
    }
}

/// The reference: one certificate of each kind the rule may meet, the CA-signed
/// one with its chain, one line with options.
fn base(pool: &Pool) -> Render {
    let mut render = Render {
        lines: Vec::new(),
        certs: BTreeMap::new(),
    };
    for (name, pem) in [
        ("ec256", pool.valid("ec256")),
        ("ec384", pool.valid("ec384")),
        ("rsa2048", pool.valid("rsa2048")),
        (
            "leaf",
            format!("{}{}{}", pool.pems["leaf"].0, pool.ca, pool.pems["leaf"].1),
        ),
    ] {
        render.certs.insert(format!("{name}.pem"), pem);
        render.lines.push(format!("certs/{name}.pem {name}.test"));
    }
    render
        .lines
        .push("certs/ec256.pem [alpn h2,http/1.1 ssl-min-ver TLSv1.2] opts.test".to_owned());
    render
}

/// Random SNI filters, mostly plain, sometimes not.
fn filters(draw: &mut Draw) -> String {
    let odd = [
        "a\"b.test",
        "$HOST",
        "b\\c.test",
        "#x",
        "é.test",
        "*",
        "*.",
        "..",
        "a..b",
        &"x".repeat(64),
        "!",
        "*.*.test",
        "-",
        "a,b",
    ];
    let mut words = Vec::new();
    for _ in 0..draw.below(4) {
        let word = if draw.chance(8) {
            odd[draw.below(odd.len())].to_owned()
        } else {
            let host = format!("h{}.example.test", draw.below(1000));
            match draw.below(4) {
                0 => format!("*.{host}"),
                1 => format!("!{host}"),
                _ => host,
            }
        };
        words.push(word);
    }
    words.join(if draw.chance(15) { "  " } else { " " })
}

/// Random crt-list options, mostly none.
fn options(draw: &mut Draw) -> &'static str {
    const OPTIONS: &[&str] = &[
        "[alpn h2,http/1.1 ssl-min-ver TLSv1.2] ",
        "[alpn h2] ",
        "[alpn h2,http/1.1] ",
        "[verify none] ",
        "[ssl-min-ver TLSv1.3] ",
        "[bogus] ",
        "[alpn ] ",
        "[alpn h2 ",
    ];
    if draw.chance(3) {
        OPTIONS[draw.below(OPTIONS.len())]
    } else {
        ""
    }
}

/// One random change; returns what it did.
fn change(render: &mut Render, pool: &Pool, draw: &mut Draw, serial: usize) -> String {
    match draw.below(6) {
        0 | 1 => {
            let (what, pem) = pem_variant(pool, draw);
            let name = format!("new{serial}.pem");
            render.certs.insert(name.clone(), pem);
            let line = format!("certs/{name} {}{}", options(draw), filters(draw));
            render.lines.push(line.trim_end().to_owned());
            format!("added: {what}")
        }
        2 => {
            let names: Vec<String> = render.certs.keys().cloned().collect();
            let name = names[draw.below(names.len())].clone();
            let (what, pem) = pem_variant(pool, draw);
            render.certs.insert(name.clone(), pem);
            format!("renewed: {what}")
        }
        3 => {
            let index = draw.below(render.lines.len());
            let line = render.lines.remove(index);
            let cert = line.split(' ').next().unwrap().trim_start_matches("certs/");
            let still_used = render
                .lines
                .iter()
                .any(|l| l.starts_with(&format!("certs/{cert} ")));
            if !still_used && draw.below(4) != 0 {
                render.certs.remove(cert);
                "removed a certificate and its line".to_owned()
            } else {
                "removed a line".to_owned()
            }
        }
        4 => {
            let index = draw.below(render.lines.len());
            let cert = render.lines[index].split(' ').next().unwrap().to_owned();
            render.lines[index] = format!("{cert} {}{}", options(draw), filters(draw))
                .trim_end()
                .to_owned();
            "changed a line".to_owned()
        }
        _ => {
            let names: Vec<String> = render.certs.keys().cloned().collect();
            let name = names[draw.below(names.len())].clone();
            render.certs.remove(&name);
            "removed a certificate, its lines kept".to_owned()
        }
    }
}

fn verdict(baseline: &Baseline, candidate: &RenderedConfig) -> Option<Equivalence> {
    let (_, model) = validator::validate_phase1_parsed(candidate).ok()?;
    Some(equivalence::compare(baseline, candidate, &model))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_change_accepted_by_equivalence_passes_haproxy_c() {
    let seed = seed("HAPWRIGHT_CERT_EQUIVALENCE_SEED");
    let mut draw = Draw(seed);
    let scratch = tempfile::tempdir().unwrap();
    let pool = Pool::new(scratch.path());
    let config = settings(scratch.path());
    let base = base(&pool);
    let rendered = base.rendered();
    validator::validate(&rendered, &config)
        .await
        .unwrap_or_else(|rejection| panic!("the base config is valid: {rejection}"));
    let (_, model) = validator::validate_phase1_parsed(&rendered).unwrap();
    let baseline = Baseline {
        rendered,
        model: Arc::new(model),
    };

    let (mut accepted, mut refused) = (BTreeMap::new(), BTreeMap::new());
    for candidate in 0..CANDIDATES {
        let mut render = base.clone();
        let done: Vec<String> = (0..1 + draw.below(3))
            .map(|step| change(&mut render, &pool, &mut draw, candidate * 10 + step))
            .collect();
        let rendered = render.rendered();
        let what = done.join("; ");
        match verdict(&baseline, &rendered) {
            Some(Equivalence::Equivalent(reason)) => {
                assert!(
                    matches!(reason, SkipReason::Certificates | SkipReason::Identical),
                    "seed {seed}: {reason:?} for {done:?}"
                );
                if let Err(rejection) = validator::validate_phase2(&rendered, &config).await {
                    panic!(
                        "seed {seed}: accepted by equivalence but haproxy -c rejects it after \
                         {done:?}: {rejection}\ncrt-list:\n{}",
                        rendered.files()["tls.crtlist"]
                    );
                }
                *accepted.entry(what).or_insert(0) += 1;
            }
            other => {
                if std::env::var_os("HAPWRIGHT_CERT_EQUIVALENCE_WHY").is_some() {
                    eprintln!("{what}: {other:?}");
                }
                *refused.entry(what).or_insert(0) += 1;
            }
        }
    }
    let accepted_count: usize = accepted.values().sum();
    assert!(
        accepted_count >= CANDIDATES / 8,
        "seed {seed}: only {accepted_count} accepted: {accepted:?}"
    );
    assert!(
        refused.values().sum::<usize>() >= CANDIDATES / 4,
        "seed {seed}: {refused:?}"
    );
    eprintln!(
        "seed {seed}: {accepted_count} of {CANDIDATES} accepted by equivalence, all passed \
         haproxy -c; refused: {refused:?}"
    );
}

/// Each kind of PEM on its own, added with a plain line: the rule accepts what it
/// is meant to accept (then `haproxy -c` agrees) and refuses what HAProxy refuses or
/// what it does not check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_pem_gets_the_expected_verdict() {
    let scratch = tempfile::tempdir().unwrap();
    let pool = Pool::new(scratch.path());
    let config = settings(scratch.path());
    let base = base(&pool);
    let rendered = base.rendered();
    validator::validate(&rendered, &config).await.unwrap();
    let (_, model) = validator::validate_phase1_parsed(&rendered).unwrap();
    let baseline = Baseline {
        rendered,
        model: Arc::new(model),
    };
    let (leaf, ca) = (&pool.pems["leaf"], &pool.ca);
    let mismatched = format!("{}{}", pool.pems["ec256"].0, pool.pems["ec256b"].1);
    let cases: Vec<(&str, String, bool)> = vec![
        ("self-signed P-256", pool.valid("ec256b"), true),
        (
            "key first",
            format!("{}{}", pool.pems["ec256b"].1, pool.pems["ec256b"].0),
            true,
        ),
        ("P-384", pool.valid("ec384"), true),
        ("RSA 2048", pool.valid("rsa2048"), true),
        (
            "RSA PKCS#1 key",
            format!("{}{}", pool.pems["rsa2048"].0, pool.rsa_traditional),
            true,
        ),
        (
            "EC SEC1 key",
            format!("{}{}", pool.pems["ec256"].0, pool.ec_sec1),
            true,
        ),
        ("expired", pool.valid("expired"), true),
        (
            "CA-signed with its chain",
            format!("{}{ca}{}", leaf.0, leaf.1),
            true,
        ),
        ("CA-signed without chain", pool.valid("leaf"), true),
        ("mismatched key", mismatched, false),
        ("garbage", "garbage\n".to_owned(), false),
        ("truncated", pool.valid("ec256b")[..300].to_owned(), false),
        ("no key", pool.pems["ec256b"].0.clone(), false),
        (
            "encrypted key",
            format!("{}{}", pool.pems["ec256"].0, pool.encrypted),
            false,
        ),
        (
            "DH parameters",
            format!("{}{}", pool.valid("ec256b"), pool.dh),
            false,
        ),
        ("RSA 1024", pool.valid("rsa1024"), false),
        ("P-521", pool.valid("ec521"), false),
        ("Ed25519", pool.valid("ed25519"), false),
        ("SHA-1 CA signature", pool.valid("leaf-sha1"), false),
        (
            "a chain the reference never served",
            format!(
                "{}{}{}",
                pool.pems["leaf-foreign"].0, pool.foreign_ca, leaf.1
            ),
            false,
        ),
        ("CRLF", pool.valid("ec256b").replace('\n', "\r\n"), false),
    ];
    for (what, pem, expected) in cases {
        let mut render = base.clone();
        render.certs.insert("new.pem".to_owned(), pem.clone());
        render
            .lines
            .push("certs/new.pem new.test *.new.test !x.new.test".to_owned());
        let rendered = render.rendered();
        let verdict = verdict(&baseline, &rendered).expect("phase 1 passes");
        assert_eq!(verdict.is_equivalent(), expected, "{what}: {verdict:?}");
        if let Equivalence::Different(why) = &verdict {
            assert!(!why.to_string().contains("PRIVATE KEY"), "{what}: {why}");
        }
        let haproxy = validator::validate_phase2(&rendered, &config).await;
        if expected {
            assert!(
                haproxy.is_ok(),
                "{what}: haproxy -c refused: {:?}",
                haproxy.err()
            );
        }
    }
}

/// Through the validation service: a new certificate passes by equivalence with
/// the reason `certificates`; a mismatched key runs `haproxy -c`, which refuses it
/// with its own message (the key never in it), and the reference stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_skips_haproxy_c_for_a_checked_certificate_only() {
    let scratch = tempfile::tempdir().unwrap();
    let pool = Pool::new(scratch.path());
    let service = Service::new(settings(scratch.path()));
    let base = base(&pool);
    let first = service.validate(&base.rendered(), None).await.unwrap();
    assert_eq!(first.phase2_skipped, None);

    let mut added = base.clone();
    added
        .certs
        .insert("shop.pem".to_owned(), pool.valid("ec256b"));
    added.lines.push("certs/shop.pem shop.test".to_owned());
    let passed = service.validate(&added.rendered(), None).await.unwrap();
    assert_eq!(passed.phase2_skipped, Some(SkipReason::Certificates));
    assert_eq!(
        service.baseline().unwrap().rendered.hash(),
        base.rendered().hash(),
        "only a render that passed haproxy -c is the reference"
    );

    let mut refused = base.clone();
    let key = pool.pems["ec256b"].1.clone();
    refused.certs.insert(
        "shop.pem".to_owned(),
        format!("{}{key}", pool.pems["ec256"].0),
    );
    refused.lines.push("certs/shop.pem shop.test".to_owned());
    let rejection = service
        .validate(&refused.rendered(), None)
        .await
        .expect_err("haproxy -c refuses a mismatched key");
    let message = rejection.to_string();
    assert!(message.contains("shop.pem"), "{message}");
    assert!(
        message.to_lowercase().contains("private key"),
        "HAProxy's words: {message}"
    );
    let body = key.lines().nth(1).unwrap();
    assert!(!message.contains(body), "the key never shows: {message}");
}

/// The rule remembers its answer on a changed crt-list (each validation compares
/// with the same baseline, and the renderer hands the same list out again): the
/// same list, shared by pointer, in a render without the certificate one of its
/// lines loads is still refused, and with it is still accepted.
#[test]
fn a_remembered_crt_list_answer_follows_the_certificates_it_names() {
    let scratch = tempfile::tempdir().unwrap();
    let pool = Pool::new(scratch.path());
    let base = base(&pool);
    let rendered = base.rendered();
    let (_, model) = validator::validate_phase1_parsed(&rendered).unwrap();
    let baseline = Baseline {
        rendered,
        model: Arc::new(model),
    };
    let mut render = base.clone();
    render
        .certs
        .insert("new.pem".to_owned(), pool.valid("ec256b"));
    render.lines.push("certs/new.pem new.test".to_owned());
    let with = render.rendered();
    let answer = verdict(&baseline, &with).expect("phase 1 passes");
    assert!(answer.is_equivalent(), "{answer:?}");

    // The same crt-list allocation, without new.pem.
    let mut certs = with.certificates().clone();
    certs.remove("new.pem");
    let without = RenderedConfig::new(
        main_config(),
        BTreeMap::new(),
        with.files().clone().into_iter().collect(),
        certs.into_iter().collect(),
        SourceMap::default(),
    );
    assert!(Arc::ptr_eq(
        &with.files()["tls.crtlist"],
        &without.files()["tls.crtlist"]
    ));
    let answer = verdict(&baseline, &without).expect("phase 1 passes");
    match &answer {
        Equivalence::Different(why) => {
            assert!(why.to_string().contains("certs/new.pem"), "{why}");
        }
        Equivalence::Equivalent(_) => panic!("a line loading a missing certificate passed"),
    }

    // And the same list with the certificate again: accepted.
    let again = RenderedConfig::new(
        main_config(),
        BTreeMap::new(),
        with.files().clone().into_iter().collect(),
        with.certificates().clone().into_iter().collect(),
        SourceMap::default(),
    );
    let answer = verdict(&baseline, &again).expect("phase 1 passes");
    assert!(answer.is_equivalent(), "{answer:?}");
}
