"""TLS and API keys against a real `kiln serve --tls-cert --tls-key --auth`, with a
self-signed certificate made here and a key made by `kiln api-key create`."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
import tempfile
import time
from typing import Dict, Iterator, Tuple

import pytest

from conftest import KilnServer, kiln_bin
from kiln_client import AuthenticationError, ConnectionFailedError, DocumentStore, KilnError


def _self_signed(dir_: str) -> Dict[str, str]:
    cert_path = os.path.join(dir_, "cert.pem")
    key_path = os.path.join(dir_, "key.pem")
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if not shutil.which("openssl"):
            pytest.fail("neither the cryptography package nor the openssl CLI is available")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", key_path, "-out", cert_path],
                       check=True, capture_output=True)
        return {"cert": cert_path, "key": key_path}
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return {"cert": cert_path, "key": key_path}


@pytest.fixture(scope="module")
def secure_server() -> Iterator[Tuple[KilnServer, str]]:
    tmp = tempfile.mkdtemp(prefix="kiln-py-tls-")
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    tls = _self_signed(tmp)
    out = subprocess.run([kiln_bin(), "api-key", "create", "--data-dir", data, "--name", "py", "--operator"],
                         check=True, capture_output=True, text=True)
    key = out.stdout.strip()
    assert key.startswith("kiln_")
    srv = KilnServer(data_dir=data, extra=["--auth"], tls=tls)
    yield srv, key
    srv.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_tls_and_api_key_everything_works(secure_server) -> None:
    srv, key = secure_server
    assert srv.url.startswith("https://")
    with DocumentStore(srv.url, "sec", api_key=key, ca=srv.tls["cert"]) as st:
        st.create_database()
        with st.session() as s:
            s.store({"name": "Ada"}, "users/ada")
            s.save_changes()
        with st.session() as s:
            assert s.load("users/ada")["name"] == "Ada"
        # 304 over TLS.
        with st.session() as s:
            s.load("users/ada")
        assert st.stats.not_modified >= 1
        # Changes over wss:// with the key.
        with st.changes() as ch:
            sub = ch.for_prefix("users/")
            assert sub.wait_subscribed(5)
            st.put("users/bob", {"name": "Bob"})
            c = sub.next(timeout=5)
            assert c is not None and c.id == "users/bob"
        # Aggressive caching over wss://.
        with st.aggressive_caching(duration=30):
            assert st.aggressive_feed_connected
            st.get("users/ada")
            n = st.stats.requests
            st.get("users/ada")
            assert st.stats.requests == n
        # Bulk insert over TLS with the key.
        with st.bulk_insert() as bulk:
            for i in range(5000):
                bulk.store({"i": i}, f"bulk/{i}")
        assert bulk.acked == 5000
        assert st.database_stats()["documents"] == 5002


def test_missing_or_wrong_key_is_refused(secure_server) -> None:
    srv, key = secure_server
    with DocumentStore(srv.url, "sec2", ca=srv.tls["cert"]) as st:
        with pytest.raises(AuthenticationError) as info:
            st.create_database()
        assert info.value.status == 401 and "API key" in info.value.message
        with pytest.raises(AuthenticationError):
            with st.bulk_insert() as bulk:
                bulk.store({"a": 1}, "a/1")
    with DocumentStore(srv.url, "sec2", api_key="kiln_00000000_" + "0" * 64,
                       ca=srv.tls["cert"]) as st:
        with pytest.raises(AuthenticationError) as info:
            st.get("a/1")
        assert "not valid" in info.value.message
        # The changes feed cannot connect without a valid key.
        with st.changes() as ch:
            ch.for_all()
            assert not ch.wait_connected(0.5)
            deadline = time.monotonic() + 5
            while ch.last_close is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ch.last_close and "401" in ch.last_close


def test_untrusted_certificate_is_refused(secure_server) -> None:
    srv, key = secure_server
    with DocumentStore(srv.url, "sec3", api_key=key) as st:  # system CAs only
        with pytest.raises(ConnectionFailedError) as info:
            st.get("a/1")
        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


def test_a_key_for_one_database_is_forbidden_beyond_it(secure_server) -> None:
    from kiln_client import ForbiddenError
    srv, key = secure_server
    with DocumentStore(srv.url, "perm", api_key=key, ca=srv.tls["cert"]) as admin:
        admin.create_database()
        admin.put("notes/1", {"text": "hi"})
        out = subprocess.run([kiln_bin(), "api-key", "create", "--data-dir", srv.data_dir,
                              "--name", "reader", "--db", "perm:read"],
                             check=True, capture_output=True, text=True)
        with DocumentStore(srv.url, "perm", api_key=out.stdout.strip(), ca=srv.tls["cert"]) as reader:
            me = reader.whoami()
            assert me["name"] == "reader"
            assert me["clearance"] == {"databases": [{"database": "perm", "access": "read"}]}
            assert reader.get("notes/1")["text"] == "hi"
            assert reader.database_names() == ["perm"]
            with pytest.raises(ForbiddenError) as refused:
                reader.put("notes/2", {"text": "no"})
            assert refused.value.status == 403 and "read_write" in str(refused.value)
        assert admin.get("notes/2") is None
        assert admin.whoami()["clearance"] == "operator"


def test_api_keys_made_and_revoked_through_the_server(secure_server) -> None:
    from kiln_client import ForbiddenError, NotFoundError
    srv, key = secure_server
    with DocumentStore(srv.url, "keys", api_key=key, ca=srv.tls["cert"]) as admin:
        admin.create_database()
        admin.put("notes/1", {"text": "hi"})
        made = admin.create_api_key("py-reader", grants=["keys:read"])
        assert made["key"].startswith("kiln_" + made["id"] + "_")
        assert made["clearance"] == {"databases": [{"database": "keys", "access": "read"}]}
        listed = {k["id"]: k for k in admin.api_keys()}
        assert listed[made["id"]]["name"] == "py-reader" and "key" not in listed[made["id"]]
        with DocumentStore(srv.url, "keys", api_key=made["key"], ca=srv.tls["cert"]) as reader:
            assert reader.get("notes/1")["text"] == "hi"
            with pytest.raises(ForbiddenError):
                reader.create_api_key("escalate", operator=True)
            admin.revoke_api_key(made["id"])
            with pytest.raises(AuthenticationError):
                reader.get("notes/1")
        with pytest.raises(NotFoundError):
            admin.revoke_api_key(made["id"])
        with pytest.raises(KilnError) as bad:
            admin.create_api_key("neither")
        assert bad.value.status == 400
