"""The lab's own certificate authority, for the lab hub's https origin (tests/lab/hub.py): made
once with openssl under ``STATE/tls`` (kept by ``down``, like the base root), trusted by every
lab host as a system CA (``lab.configure_root``: ``/usr/local/share/ca-certificates`` and the
system bundle, as Debian's update-ca-certificates would), and by the controller's clients of a
test through ``SSL_CERT_FILE`` (:func:`controller_bundle`: the controller's own CAs plus the
lab's; both urllib and huggingface_hub's httpx read it). Nothing on the controller's own trust
store changes. Standard library and the openssl command.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.lab import lab

TLS = lab.STATE / "tls"
CA, CA_KEY = TLS / "ca.crt", TLS / "ca.key"
DAYS = "3650"


def ca() -> Path:
    """The lab CA's certificate (made on first use)."""
    if not CA.exists():
        TLS.mkdir(parents=True, exist_ok=True)
        lab.run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", "/CN=rigup lab CA",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout", CA_KEY, "-out", CA)
        CA_KEY.chmod(0o600)
    return CA


def server_cert(address: str) -> tuple[Path, Path]:
    """(certificate, key) of a server at the IP ``address``, from the lab CA (made on first use)."""
    authority = ca()
    crt, key = TLS / f"server-{address}.crt", TLS / f"server-{address}.key"
    if not crt.exists() or crt.stat().st_mtime < authority.stat().st_mtime:
        with tempfile.TemporaryDirectory() as tmp:
            ext, csr = Path(tmp) / "ext", Path(tmp) / "csr"
            ext.write_text(f"subjectAltName=IP:{address}\nbasicConstraints=critical,CA:FALSE\n"
                           "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
            lab.run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={address}", "-keyout", key,
                    "-out", csr)
            lab.run("openssl", "x509", "-req", "-in", csr, "-CA", authority, "-CAkey", CA_KEY, "-CAcreateserial",
                    "-days", DAYS, "-extfile", ext, "-out", crt)
        key.chmod(0o600)
    return crt, key


def controller_bundle() -> Path:
    """A CA bundle for the controller's clients of a test (``SSL_CERT_FILE``): the controller's
    system CAs and the lab's."""
    bundle = TLS / "controller-bundle.pem"
    lab.write(bundle, Path("/etc/ssl/certs/ca-certificates.crt").read_bytes() + ca().read_bytes())
    return bundle


def trust_in(root: Path) -> None:
    """Make the lab host at ``root`` trust the lab CA as a system CA: in
    /usr/local/share/ca-certificates (kept by any later update-ca-certificates) and appended to the
    system bundle that OpenSSL (and so Python's urllib) reads."""
    pem = ca().read_bytes()
    lab.write(root / "usr/local/share/ca-certificates/rigup-lab-ca.crt", pem)
    bundle = root / "etc/ssl/certs/ca-certificates.crt"
    if bundle.exists() and pem not in bundle.read_bytes():
        lab.write(bundle, bundle.read_bytes() + pem)
