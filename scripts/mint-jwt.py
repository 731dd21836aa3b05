#!/usr/bin/env python3
"""mint-jwt.py: mint a compact JWT for the gateway's benchmarks and tests (stdlib + openssl).

Usage:
  python3 scripts/mint-jwt.py hs256 SECRET_FILE [TTL_SECS=3600] > token
  python3 scripts/mint-jwt.py es256 EC_P256_PRIVATE_KEY_PEM [TTL_SECS=3600] > token

Claims: {"sub":"bench","exp":<now+TTL>,"gateway":{"publish":["*"],"subscribe":["*"]}}.
HS256 signs with the secret file's bytes as the gateway reads them (the whole file, one trailing
line ending removed).
ES256 signs with `openssl dgst -sha256 -sign KEY` and converts the DER ECDSA-Sig-Value to the
raw r||s (32 + 32 bytes) form JWS requires (RFC 7518 3.4). Exit status 2 on bad usage.
"""

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def der_to_raw(der: bytes) -> bytes:
    """DER SEQUENCE { INTEGER r, INTEGER s } -> r||s, each left-padded to 32 bytes."""

    def length(buf: bytes, i: int):
        n = buf[i]
        if n < 0x80:
            return n, i + 1
        k = n & 0x7F
        return int.from_bytes(buf[i + 1:i + 1 + k], "big"), i + 1 + k

    if der[0] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    _, i = length(der, 1)
    out = b""
    for _ in range(2):
        if der[i] != 0x02:
            raise ValueError("not a DER INTEGER")
        n, i = length(der, i + 1)
        v = der[i:i + n].lstrip(b"\x00")
        if len(v) > 32:
            raise ValueError("integer longer than 32 bytes")
        out += v.rjust(32, b"\x00")
        i += n
    return out


def main() -> int:
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("hs256", "es256"):
        sys.stderr.write(__doc__)
        return 2
    alg, key = sys.argv[1], sys.argv[2]
    ttl = int(sys.argv[3]) if len(sys.argv) == 4 else 3600
    header = {"alg": alg.upper(), "typ": "JWT"}
    claims = {
        "sub": "bench",
        "exp": int(time.time()) + ttl,
        "gateway": {"publish": ["*"], "subscribe": ["*"]},
    }
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    ).encode("ascii")
    if alg == "hs256":
        with open(key, "rb") as f:
            secret = f.read()
        secret = secret.removesuffix(b"\n").removesuffix(b"\r")
        sig = hmac.new(secret, signing_input, hashlib.sha256).digest()
    else:
        der = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", key],
            input=signing_input,
            capture_output=True,
            check=True,
        ).stdout
        sig = der_to_raw(der)
    print(signing_input.decode("ascii") + "." + b64url(sig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
