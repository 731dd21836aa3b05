//! Key files to verification keys: an HS256 secret's bytes, and a PEM public key's kind
//! (RSA, EC P-256, Ed25519), read from its label and its SubjectPublicKeyInfo's algorithm
//! OIDs. Reads no file itself (the caller passes the bytes) and verifies no token.

use jsonwebtoken::DecodingKey;

use crate::alg::KeyAlg;

/// Bytes an HS256 secret must have at least (RFC 7518 §3.2: a key of the hash's size).
pub const SECRET_BYTES_MIN: usize = 32;
/// Keys (secrets and public keys together) that may be configured; also the usable keys one
/// JWKS document may bring.
pub const KEYS_MAX: usize = 32;
/// Bits an RSA modulus must have at least.
pub const RSA_MODULUS_BITS_MIN: usize = 2048;

/// rsaEncryption, 1.2.840.113549.1.1.1 (DER content octets).
const OID_RSA: &[u8] = &[0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01];
/// id-ecPublicKey, 1.2.840.10045.2.1.
const OID_EC: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01];
/// prime256v1 (P-256), 1.2.840.10045.3.1.7.
const OID_P256: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07];
/// Ed25519, 1.3.101.112.
const OID_ED25519: &[u8] = &[0x2B, 0x65, 0x70];

const TAG_SEQUENCE: u8 = 0x30;
const TAG_OID: u8 = 0x06;
const TAG_INTEGER: u8 = 0x02;

/// An HS256 secret from a file's contents: one trailing line ending (`\n` or `\r\n`) removed,
/// at least [`SECRET_BYTES_MIN`] bytes, and not a PEM block (a public key used as an HMAC secret
/// is the HS/RS confusion this crate exists to refuse).
pub(crate) fn hs256_secret(contents: &[u8]) -> Result<DecodingKey, String> {
    let secret = contents.strip_suffix(b"\n").unwrap_or(contents);
    let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
    if secret.trim_ascii_start().starts_with(b"-----BEGIN") {
        return Err(
            "is a PEM file: an HS256 secret must be private random bytes \
                    (public keys go to --jwt-public-key-file)"
                .into(),
        );
    }
    if secret.len() < SECRET_BYTES_MIN {
        return Err(format!(
            "secret has {} bytes, at least {SECRET_BYTES_MIN} are required",
            secret.len()
        ));
    }
    DecodingKey::from_secret(secret).map_err(|e| format!("unusable secret: {e}"))
}

/// A PEM public key and the one algorithm it verifies: RSA → RS256, EC P-256 → ES256,
/// Ed25519 → EdDSA. Private keys, certificates and other curves are refused by name.
pub(crate) fn public_key(pem_bytes: &[u8]) -> Result<(KeyAlg, DecodingKey), String> {
    let block = pem::parse(pem_bytes).map_err(|e| format!("not a PEM file ({e})"))?;
    let alg = match block.tag() {
        "RSA PUBLIC KEY" => KeyAlg::Rs256,
        "PUBLIC KEY" => spki_alg(block.contents())?,
        "CERTIFICATE" => {
            return Err("is a certificate: give its public key \
                        (openssl x509 -in CERT -pubkey -noout)"
                .into());
        }
        tag if tag.contains("PRIVATE KEY") => {
            return Err("is a private key: give the public key \
                        (openssl pkey -in KEY -pubout)"
                .into());
        }
        tag => return Err(format!("PEM block {tag:?} is not a public key")),
    };
    let key = match alg {
        KeyAlg::Rs256 => DecodingKey::from_rsa_pem(pem_bytes),
        KeyAlg::Es256 => DecodingKey::from_ec_pem(pem_bytes),
        KeyAlg::EdDsa => DecodingKey::from_ed_pem(pem_bytes),
        KeyAlg::Hs256 => unreachable!("a PEM file is never an HS256 key"),
    }
    .map_err(|e| format!("unreadable {} public key ({e})", alg.key_kind()))?;
    if alg == KeyAlg::Rs256 {
        check_rsa_modulus(&key)?;
    }
    probe(alg, &key)?;
    Ok((alg, key))
}

/// The algorithm of a DER SubjectPublicKeyInfo:
/// `SEQUENCE { SEQUENCE { OID algorithm, parameters }, BIT STRING key }`.
fn spki_alg(der: &[u8]) -> Result<KeyAlg, String> {
    let bad = |_| String::from("malformed SubjectPublicKeyInfo");
    let (spki, _) = der_take(der, TAG_SEQUENCE).map_err(bad)?;
    let (alg_id, _) = der_take(spki, TAG_SEQUENCE).map_err(bad)?;
    let (oid, params) = der_take(alg_id, TAG_OID).map_err(bad)?;
    match oid {
        OID_RSA => Ok(KeyAlg::Rs256),
        OID_ED25519 => Ok(KeyAlg::EdDsa),
        OID_EC => match der_take(params, TAG_OID) {
            Ok((OID_P256, _)) => Ok(KeyAlg::Es256),
            _ => Err("EC key not on P-256 (only ES256 is supported)".into()),
        },
        _ => Err("unsupported public key algorithm (RSA, EC P-256 or Ed25519 only)".into()),
    }
}

/// Refuses an RSA key (PKCS#1 `SEQUENCE { INTEGER n, INTEGER e }`) whose modulus is shorter
/// than [`RSA_MODULUS_BITS_MIN`].
fn check_rsa_modulus(key: &DecodingKey) -> Result<(), String> {
    let bad = |_| String::from("malformed RSA public key");
    let der = key
        .try_get_as_bytes()
        .map_err(|_| "malformed RSA public key".to_string())?;
    let (seq, _) = der_take(der, TAG_SEQUENCE).map_err(bad)?;
    let (n, _) = der_take(seq, TAG_INTEGER).map_err(bad)?;
    let n = match n.iter().position(|&b| b != 0) {
        Some(i) => &n[i..],
        None => &[][..],
    };
    let bits = match n.first() {
        Some(&top) => n.len() * 8 - top.leading_zeros() as usize,
        None => 0,
    };
    if bits < RSA_MODULUS_BITS_MIN {
        return Err(format!(
            "RSA modulus has {bits} bits, at least {RSA_MODULUS_BITS_MIN} are required"
        ));
    }
    Ok(())
}

/// Builds the key's verifier once (a dummy signature), so a key the backend cannot use fails
/// at load rather than making every token look forged.
pub(crate) fn probe(alg: KeyAlg, key: &DecodingKey) -> Result<(), String> {
    match jsonwebtoken::crypto::verify("AAAA", b"probe", key, alg.jwt()) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("unusable {} public key ({e})", alg.key_kind())),
    }
}

/// One DER element with tag `tag` at the start of `input`: its contents and what follows it.
/// Definite lengths only (DER has no other), up to four length bytes.
fn der_take(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), ()> {
    let (&t, rest) = input.split_first().ok_or(())?;
    if t != tag {
        return Err(());
    }
    let (&first, mut rest) = rest.split_first().ok_or(())?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(());
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return Err(());
    }
    Ok(rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths() {
        assert_eq!(
            der_take(&[0x06, 0x01, 0xAA, 0xBB], 0x06),
            Ok((&[0xAA][..], &[0xBB][..]))
        );
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend(std::iter::repeat_n(7u8, 0x80));
        assert_eq!(
            der_take(&long, 0x04).map(|(c, r)| (c.len(), r.len())),
            Ok((0x80, 0))
        );
        assert_eq!(der_take(&[0x06, 0x05, 0x00], 0x06), Err(()), "truncated");
        assert_eq!(der_take(&[0x06, 0x80], 0x06), Err(()), "indefinite length");
        assert_eq!(der_take(&[0x02, 0x00], 0x06), Err(()), "wrong tag");
        assert_eq!(der_take(&[], 0x06), Err(()));
    }

    #[test]
    fn secrets() {
        let s = [b'k'; SECRET_BYTES_MIN];
        assert!(hs256_secret(&s).is_ok());
        let mut with_nl = s.to_vec();
        with_nl.extend_from_slice(b"\r\n");
        assert!(hs256_secret(&with_nl).is_ok());
        let err = hs256_secret(&s[1..]).unwrap_err();
        assert!(err.contains("31 bytes"), "{err}");
        let mut short_nl = s[1..].to_vec();
        short_nl.push(b'\n');
        assert!(
            hs256_secret(&short_nl).is_err(),
            "the newline does not count"
        );
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{}\n", "A".repeat(64));
        assert!(hs256_secret(pem.as_bytes()).unwrap_err().contains("PEM"));
    }

    #[test]
    fn non_keys() {
        assert!(public_key(b"hello").unwrap_err().contains("not a PEM"));
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(
            public_key(cert.as_bytes())
                .unwrap_err()
                .contains("certificate")
        );
    }
}
