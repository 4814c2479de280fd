//! Authentication (API keys, client certificates), TLS, and the refusal to listen
//! off loopback without them.
#![allow(clippy::unwrap_used)] // a test's unwrap failing is its answer

use crate::common::{expect_error, Harness};
use kiln_server::{auth, RunningServer, ServerConfig, TlsConfig};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

// ---------------------------------------------------------------- API keys

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_required_and_revocable() {
    let dir = tempfile::tempdir().unwrap();
    let (record, key) =
        auth::create_api_key(dir.path(), "test", kiln_server::access::Clearance::Operator).unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let dbs = h.url("/dbs");

    // No key.
    let r = h.http.get(&dbs).send().await.unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"kiln\"");
    expect_error(r, 401, "unauthorized").await;
    let r = h.http.put(h.url("/dbs/sec")).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h.http.get(h.url("/metrics")).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;

    // Wrong keys.
    let mut tampered = key.clone();
    let last = tampered.pop().unwrap();
    tampered.push(if last == '0' { '1' } else { '0' });
    for wrong in [
        tampered.as_str(),
        "kiln_00000000_0000",
        "nonsense",
        &format!("{key}x"),
    ] {
        let r = h.http.get(&dbs).bearer_auth(wrong).send().await.unwrap();
        assert!(r.headers().contains_key("www-authenticate"));
        expect_error(r, 401, "unauthorized").await;
        let r = h
            .http
            .get(&dbs)
            .header("x-api-key", wrong)
            .send()
            .await
            .unwrap();
        expect_error(r, 401, "unauthorized").await;
    }

    // The right key, either way.
    let r = h.http.get(&dbs).bearer_auth(&key).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The scheme name is case-insensitive.
    let r = h
        .http
        .get(&dbs)
        .header("authorization", format!("bearer {key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = h
        .http
        .get(&dbs)
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = h
        .http
        .put(h.url("/dbs/sec"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Two different keys (one valid) are refused, on the router and on the own
    // loop's document path alike: the valid one must not let the other pass. The
    // same key twice is one key.
    for url in [h.url("/dbs/sec2"), h.doc_url("sec", "a")] {
        let r = h
            .http
            .put(&url)
            .bearer_auth(&key)
            .header("x-api-key", "kiln_0000_0000")
            .json(&json!({"x": 1}))
            .send()
            .await
            .unwrap();
        let body = expect_error(r, 401, "unauthorized").await;
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("two different API keys"),
            "{body}"
        );
    }
    let r = h
        .http
        .get(&dbs)
        .bearer_auth(&key)
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // A write without a key is refused and writes nothing.
    let r = h.put("sec", "a", &json!({"x": 1})).await;
    expect_error(r, 401, "unauthorized").await;
    let r = h
        .http
        .get(h.doc_url("sec", "a"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    expect_error(r, 404, "document_not_found").await;
    let r = h
        .http
        .put(h.doc_url("sec", "a"))
        .header("x-api-key", &key)
        .json(&json!({"x": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    // /health needs no key.
    let r = h.http.get(h.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // A key created while running works at once; a revoked one stops working.
    let (_, second) = auth::create_api_key(
        &h.data_dir(),
        "second",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let r = h.http.get(&dbs).bearer_auth(&second).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    auth::revoke_api_key(&h.data_dir(), &record.id).unwrap();
    let r = h.http.get(&dbs).bearer_auth(&key).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h
        .http
        .get(&dbs)
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h.http.get(&dbs).bearer_auth(&second).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.shutdown().await;
}

/// File timestamps are coarse (a kernel tick): a key file rewritten right after the
/// server last read it may keep the same mtime. The revocation must still be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_with_an_unchanged_mtime_is_still_seen() {
    let dir = tempfile::tempdir().unwrap();
    let (record, key) =
        auth::create_api_key(dir.path(), "test", kiln_server::access::Clearance::Operator).unwrap();
    let (_, other) = auth::create_api_key(
        dir.path(),
        "other",
        kiln_server::access::Clearance::Operator,
    )
    .unwrap();
    let h = Harness::start_in(dir, |c| c.require_auth = true).await;
    let dbs = h.url("/dbs");
    let r = h.http.get(&dbs).bearer_auth(&key).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let file = h.data_dir().join(auth::API_KEYS_FILE);
    let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
    auth::revoke_api_key(&h.data_dir(), &record.id).unwrap();
    // As if the rewrite had happened within the same timestamp tick.
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), mtime);

    let r = h.http.get(&dbs).bearer_auth(&key).send().await.unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = h.http.get(&dbs).bearer_auth(&other).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.shutdown().await;
}

// ---------------------------------------------------------------- TLS

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    ca_path: PathBuf,
    cert_path: PathBuf,
    key_path: PathBuf,
    /// A client certificate signed by the CA, with its key (for `Identity::from_pem`).
    client_identity: String,
    /// A client certificate signed by some other CA.
    /// Signed by the trusted CA, but never registered with the server.
    unregistered_identity: String,
    stranger_identity: String,
}

fn new_ca(name: &str) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

fn client_identity(name: &str, ca: &Certificate, ca_key: &KeyPair) -> String {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, ca, ca_key).unwrap();
    format!("{}{}", cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let (ca, ca_key) = new_ca("Kiln Test CA");
    let server_key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, "localhost");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = p.signed_by(&server_key, &ca, &ca_key).unwrap();
    let (other_ca, other_key) = new_ca("Some Other CA");

    let write = |name: &str, text: &str| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca_pem: ca.pem(),
        ca_path: write("ca.pem", &ca.pem()),
        // The chain: the server certificate, then its issuer.
        cert_path: write("server.pem", &format!("{}{}", server.pem(), ca.pem())),
        key_path: write("server.key", &server_key.serialize_pem()),
        client_identity: client_identity("trusted client", &ca, &ca_key),
        unregistered_identity: client_identity("unregistered client", &ca, &ca_key),
        stranger_identity: client_identity("stranger", &other_ca, &other_key),
        dir,
    }
}

fn tls_config(pki: &Pki, client_ca: bool) -> TlsConfig {
    TlsConfig {
        cert_chain_pem: pki.cert_path.clone(),
        private_key_pem: pki.key_path.clone(),
        client_ca_pem: client_ca.then(|| pki.ca_path.clone()),
    }
}

/// An HTTPS client that trusts only the test CA, resolving `localhost` to `addr`.
fn https_client(pki: &Pki, addr: SocketAddr, identity: Option<&str>) -> Client {
    let mut b = Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap())
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(10));
    if let Some(id) = identity {
        b = b.identity(reqwest::Identity::from_pem(id.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_trusted_ca_and_no_plain_http() {
    let pki = pki();
    let h = Harness::start_with(|c| c.tls = Some(tls_config(&pki, false))).await;
    let port = h.addr.port();
    let https = https_client(&pki, h.addr, None);

    for base in [
        format!("https://localhost:{port}"),
        format!("https://127.0.0.1:{port}"),
    ] {
        let r = https.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{base}");
        assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    }
    let base = format!("https://localhost:{port}");
    let r = https.put(format!("{base}/dbs/tls")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = https
        .put(format!("{base}/dbs/tls/docs/secret/1"))
        .json(&json!({"v": "over TLS"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = https
        .get(format!("{base}/dbs/tls/docs/secret/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["v"], "over TLS");

    // Plain HTTP to the TLS port: a 400 that says to use https, never data (not
    // even /health's), and the connection closes.
    let plain = h
        .http
        .get(format!("http://127.0.0.1:{port}/dbs/tls/docs/secret/1"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::BAD_REQUEST);
    let id = plain.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let v: Value = plain.json().await.unwrap();
    assert_eq!(v["request_id"], id.as_str());
    assert_eq!(v["error"], "bad_request");
    assert!(v["message"].as_str().unwrap().contains("https"), "{v}");
    // A client that does not trust the CA refuses the server.
    let untrusting = Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .resolve("localhost", h.addr)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(untrusting
        .get(format!("{base}/health"))
        .send()
        .await
        .is_err());
    // The server still serves after those failed handshakes.
    let r = https.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.shutdown().await;
    drop(pki.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_client_certificates_authenticate_with_their_permissions() {
    use kiln_server::access::{Clearance, DbGrant};
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let (_, key) = auth::create_api_key(dir.path(), "test", Clearance::Operator).unwrap();
    // The certificate is registered by thumbprint, with admin of `mtls` only.
    let cert_file = pki.dir.path().join("client.pem");
    std::fs::write(&cert_file, &pki.client_identity).unwrap();
    let mtls_admin = Clearance::Databases(vec![DbGrant::parse("mtls:admin").unwrap()]);
    let record =
        auth::register_certificate(dir.path(), "svc", mtls_admin.clone(), &cert_file).unwrap();
    let again = auth::register_certificate(dir.path(), "svc", mtls_admin, &cert_file);
    assert!(
        matches!(again, Err(auth::AuthError::CertificateExists { .. })),
        "{again:?}"
    );
    let h = Harness::start_in(dir, |c| {
        c.tls = Some(tls_config(&pki, true));
        c.require_auth = true;
    })
    .await;
    let base = format!("https://localhost:{}", h.addr.port());

    // The registered certificate is enough, within its permissions.
    let with_cert = https_client(&pki, h.addr, Some(&pki.client_identity));
    let r = with_cert
        .get(format!("{base}/whoami"))
        .send()
        .await
        .unwrap();
    let me: Value = r.json().await.unwrap();
    assert_eq!(me["key_id"], record.id.as_str());
    assert_eq!(me["kind"], "certificate");
    assert_eq!(
        me["clearance"],
        json!({"databases": [{"database": "mtls", "access": "admin"}]})
    );
    let r = with_cert
        .put(format!("{base}/dbs/elsewhere"))
        .send()
        .await
        .unwrap();
    let v = expect_error(r, 403, "forbidden").await;
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("admin on database \"elsewhere\""),
        "{v}"
    );
    let r = with_cert
        .put(format!("{base}/dbs/mtls"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = with_cert
        .put(format!("{base}/dbs/mtls/docs/a"))
        .json(&json!({"by": "certificate"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = with_cert.get(format!("{base}/dbs")).send().await.unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"databases": ["mtls"]})
    );

    // A certificate of the trusted CA that is not registered: 401 naming its
    // thumbprint; with a valid key besides it, the key counts.
    let unregistered = https_client(&pki, h.addr, Some(&pki.unregistered_identity));
    let r = unregistered
        .get(format!("{base}/dbs"))
        .send()
        .await
        .unwrap();
    let v = expect_error(r, 401, "unauthorized").await;
    assert!(
        v["message"].as_str().unwrap().contains("not registered"),
        "{v}"
    );
    let r = unregistered
        .get(format!("{base}/dbs/mtls/docs/a"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // No certificate and no key: 401. No certificate but a key: fine.
    let without = https_client(&pki, h.addr, None);
    let r = without.get(format!("{base}/dbs")).send().await.unwrap();
    assert!(r.headers().contains_key("www-authenticate"));
    expect_error(r, 401, "unauthorized").await;
    let r = without
        .get(format!("{base}/dbs/mtls/docs/a"))
        .send()
        .await
        .unwrap();
    expect_error(r, 401, "unauthorized").await;
    let r = without
        .get(format!("{base}/dbs/mtls/docs/a"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["by"], "certificate");
    let r = without.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // A certificate from another CA does not get through the handshake.
    let stranger = https_client(&pki, h.addr, Some(&pki.stranger_identity));
    let r = stranger.get(format!("{base}/dbs")).send().await;
    assert!(
        r.is_err(),
        "a stranger's certificate got {:?}",
        r.map(|r| r.status())
    );
    h.shutdown().await;
}

// ---------------------------------------------------------------- binding

fn public_config(dir: &Path) -> ServerConfig {
    let mut c = crate::common::config(dir);
    c.bind = "0.0.0.0:0".parse().unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_needs_tls_and_auth_or_unsecured() {
    let dir = tempfile::tempdir().unwrap();
    match RunningServer::start(public_config(dir.path())).await {
        Ok(_) => panic!("started on 0.0.0.0 without TLS or authentication"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("--unsecured"), "{msg}");
            assert!(
                msg.contains("TLS") && msg.contains("authentication"),
                "{msg}"
            );
        }
    }
    let mut auth_only = public_config(dir.path());
    auth_only.require_auth = true;
    match RunningServer::start(auth_only).await {
        Ok(_) => panic!("started on 0.0.0.0 without TLS"),
        Err(e) => assert!(e.to_string().contains("--unsecured"), "{e}"),
    }

    let mut open = public_config(dir.path());
    open.unsecured = true;
    let server = RunningServer::start(open)
        .await
        .expect("--unsecured starts");
    assert!(server.local_addr().ip().is_unspecified());
    let port = server.local_addr().port();
    let r = crate::common::client()
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    server.shutdown().await.unwrap();
}
