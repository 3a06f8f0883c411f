//! What the issuer's keys say of tokens: signatures made here (ES256 with a key ring generates,
//! RS256 with a fixed key), forged, expired, of other issuers; and junk of every shape, which
//! never panics.

use base64::Engine;
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair},
};
use serde_json::json;
use testkit::rng::Rng;

use super::jwks::*;

pub const ISSUER: &str = "https://kubernetes.default.svc";
/// The time the tokens below are judged at (seconds since the Unix epoch).
pub const NOW: f64 = 1_800_000_600.0;

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A P-256 key pair and the `kid` it is published under.
pub struct Signer {
    pub kid: String,
    pair: EcdsaKeyPair,
}

impl Signer {
    pub fn new(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        Self {
            kid: kid.into(),
            pair,
        }
    }

    /// Its JWK, as the apiserver publishes an ECDSA key.
    pub fn jwk(&self) -> serde_json::Value {
        let point = self.pair.public_key().as_ref();
        json!({"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
               "x": b64(&point[1..33]), "y": b64(&point[33..65])})
    }

    /// A token with `header` and `claims`, signed.
    pub fn sign(&self, header: serde_json::Value, claims: serde_json::Value) -> String {
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signed.as_bytes())
            .unwrap();
        format!("{signed}.{}", b64(signature.as_ref()))
    }

    /// A ServiceAccount token of [`ISSUER`] for `sub`, valid an hour from `iat`.
    pub fn token(&self, sub: &str, iat: f64) -> String {
        self.sign(
            json!({"alg": "ES256", "kid": self.kid}),
            json!({"iss": ISSUER, "sub": sub, "aud": [ISSUER], "iat": iat, "nbf": iat, "exp": iat + 3600.0}),
        )
    }
}

/// The discovery document and key set of [`ISSUER`] with `keys`.
pub fn documents(keys: &[serde_json::Value]) -> (Vec<u8>, Vec<u8>) {
    (
        json!({"issuer": ISSUER, "jwks_uri": format!("{ISSUER}/openid/v1/jwks")})
            .to_string()
            .into_bytes(),
        json!({ "keys": keys }).to_string().into_bytes(),
    )
}

fn key_set(keys: &[serde_json::Value]) -> KeySet {
    let (discovery, jwks) = documents(keys);
    KeySet::parse(&discovery, &jwks).unwrap()
}

fn checked(token: &str, keys: &KeySet) -> TokenCheck {
    check(&Jwt::parse(token).unwrap(), keys, NOW)
}

/// An RSA key and a token it signed (RS256, `iss` [`ISSUER`], valid from 1800000000 to
/// 1800003600), as the apiserver publishes and signs them.
const RSA_JWK: &str = r#"{"use": "sig", "kty": "RSA", "kid": "rsa-fixture", "alg": "RS256", "n": "oY0OL5qzAwqyIsDq8TEREgzkjvPE18iRYxyrhMMJez5Sx6Zex-fIpvSqyKFKA9nRe0ks_5gycYHHpOWlF2km1qcg2ADe_FuM4SfhguOt8x6lsv4Va2ST_nqvCAOZ9-yX66iHJKnWzXzcOIY_0CtHioo4rrHvoXF6RH-KxnKr8pQe6vN5BfLBcxjtjCXeJqnGtbxlAuWAp1Q6WAb10EH_Yh3hGQQqXNfyiLP3622RFafo34Rgs7YGDxchWB2HL9ztkWCrc82xgMBi6lgBVS1BReYsjqt0ca1QK_FthqlsTNv1LBg3WRxiZFPqFm8jSxdJ07BiLIQPwRKW-wiE2cHeRw", "e": "AQAB"}"#;
const RSA_TOKEN: &str = "eyJhbGciOiJSUzI1NiIsImtpZCI6InJzYS1maXh0dXJlIn0.eyJhdWQiOlsiaHR0cHM6Ly9rdWJlcm5ldGVzLmRlZmF1bHQuc3ZjIl0sImV4cCI6MTgwMDAwMzYwMCwiaWF0IjoxODAwMDAwMDAwLCJpc3MiOiJodHRwczovL2t1YmVybmV0ZXMuZGVmYXVsdC5zdmMiLCJuYmYiOjE4MDAwMDAwMDAsInN1YiI6InN5c3RlbTpzZXJ2aWNlYWNjb3VudDptb25pdG9yaW5nOnByb21ldGhldXMifQ.cMF6H19AaZ6bb77p5kBpV3JE0gx65lKglN3z1oFBqwSFboQQu5YhlPzkvxWMn3XtrpyeJ7UhzTD4Gxka7XTZ6i9argKZyMfZjGrS7vPnS2SAKrqM0VehboJk6IhEkaYJMbSCgFHsrDV4ne4bMZp2bSb0jmANKklzRb30fXT1eNXjm5zxCxZbq7iz-gpjxbiqQNHTlATsEMmcua--Z_hF734RNOAtg6zp7d56qEo0ycrHlqHttX5NOCtQHDgg4CVebxYsnZSjEMbIlzfg5jnoQtPJSFLy0eX5XWgMmwDq2RNyBY37mjSj1gcXwyi95ycVs-obHJaPEnmuW1gIddFlnw";

/// `token` with one byte of its signature changed.
pub fn forged(token: &str) -> String {
    let (signed, signature) = token.rsplit_once('.').unwrap();
    let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .unwrap();
    bytes[10] ^= 1;
    format!("{signed}.{}", b64(&bytes))
}

#[test]
fn a_signature_of_the_issuers_key_verifies_and_a_forged_one_does_not() {
    let es = Signer::new("es-key");
    let rsa: serde_json::Value = serde_json::from_str(RSA_JWK).unwrap();
    let keys = key_set(&[es.jwk(), rsa]);
    assert_eq!(keys.counts(), (2, 2));
    let es_token = es.token("system:serviceaccount:monitoring:prometheus", NOW - 60.0);
    for (name, token, want) in [
        ("ES256", es_token.clone(), TokenCheck::Signed),
        ("RS256", RSA_TOKEN.to_string(), TokenCheck::Signed),
        (
            "ES256 forged",
            forged(&es_token),
            TokenCheck::Refused(Flaw::BadSignature),
        ),
        (
            "RS256 forged",
            forged(RSA_TOKEN),
            TokenCheck::Refused(Flaw::BadSignature),
        ),
    ] {
        assert_eq!(checked(&token, &keys), want, "{name}");
    }
}

/// `alg: none`, HS256 with the public key as the secret (the classic confusion), an
/// algorithm not the key's, a signature of another key under this key's id: all refused.
#[test]
fn only_the_keys_own_algorithm_is_accepted() {
    let es = Signer::new("es-key");
    let other = Signer::new("es-key");
    let rsa: serde_json::Value = serde_json::from_str(RSA_JWK).unwrap();
    let keys = key_set(&[es.jwk(), rsa]);
    let claims = json!({"iss": ISSUER, "sub": "x", "exp": NOW + 600.0});
    let unsigned = |alg: &str, kid: &str, signature: &[u8]| {
        format!(
            "{}.{}.{}",
            b64(json!({"alg": alg, "kid": kid}).to_string().as_bytes()),
            b64(claims.to_string().as_bytes()),
            b64(signature)
        )
    };
    let hmac = {
        let token = unsigned("HS256", "rsa-fixture", b"");
        let signed = token.trim_end_matches('.');
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, RSA_JWK.as_bytes());
        format!(
            "{signed}.{}",
            b64(ring::hmac::sign(&key, signed.as_bytes()).as_ref())
        )
    };
    let es_on_rsa = es.sign(
        json!({"alg": "ES256", "kid": "rsa-fixture"}),
        claims.clone(),
    );
    let rs_header_on_es = es.sign(json!({"alg": "RS256", "kid": "es-key"}), claims.clone());
    let another_key = other.sign(json!({"alg": "ES256", "kid": "es-key"}), claims.clone());
    for (name, token) in [
        ("none", unsigned("none", "es-key", b"")),
        ("none, with a signature", unsigned("none", "es-key", b"x")),
        ("HS256", hmac),
        ("ES256 under an RSA key's id", es_on_rsa),
        ("RS256 under an EC key's id", rs_header_on_es),
        ("no alg", unsigned("", "es-key", &[0; 64])),
        ("another key's signature", another_key),
    ] {
        assert_eq!(
            checked(&token, &keys),
            TokenCheck::Refused(Flaw::BadSignature),
            "{name}"
        );
    }
}

#[test]
fn expiry_and_not_before_hold_with_a_leeway() {
    let es = Signer::new("k");
    let keys = key_set(&[es.jwk()]);
    let with = |claims: serde_json::Value| es.sign(json!({"alg": "ES256", "kid": "k"}), claims);
    for (name, claims, want) in [
        (
            "valid",
            json!({"iss": ISSUER, "exp": NOW + 1.0, "nbf": NOW - 1.0}),
            TokenCheck::Signed,
        ),
        ("no exp, no nbf", json!({"iss": ISSUER}), TokenCheck::Signed),
        (
            "expired within the leeway",
            json!({"iss": ISSUER, "exp": NOW - LEEWAY_SECS + 1.0}),
            TokenCheck::Signed,
        ),
        (
            "expired",
            json!({"iss": ISSUER, "exp": NOW - LEEWAY_SECS - 1.0}),
            TokenCheck::Refused(Flaw::Expired),
        ),
        (
            "exp not a number",
            json!({"iss": ISSUER, "exp": "never"}),
            TokenCheck::Refused(Flaw::Expired),
        ),
        (
            "nbf within the leeway",
            json!({"iss": ISSUER, "nbf": NOW + LEEWAY_SECS - 1.0}),
            TokenCheck::Signed,
        ),
        (
            "not yet valid",
            json!({"iss": ISSUER, "nbf": NOW + LEEWAY_SECS + 1.0}),
            TokenCheck::Refused(Flaw::NotYetValid),
        ),
        (
            "nbf not a number",
            json!({"iss": ISSUER, "nbf": [1]}),
            TokenCheck::Refused(Flaw::NotYetValid),
        ),
    ] {
        assert_eq!(checked(&with(claims), &keys), want, "{name}");
    }
    // A forged expired token is a forgery first.
    let expired = with(json!({"iss": ISSUER, "exp": 1.0}));
    assert_eq!(
        checked(&forged(&expired), &keys),
        TokenCheck::Refused(Flaw::BadSignature)
    );
}

#[test]
fn other_issuers_unknown_and_unchecked_keys() {
    let es = Signer::new("k");
    let keys = key_set(&[
        es.jwk(),
        json!({"kty": "EC", "kid": "p521", "crv": "P-521", "x": "AA", "y": "AA"}),
        json!({"kty": "RSA", "kid": "rsa1024", "n": b64(&[0xc1; 128]), "e": "AQAB"}),
        json!({"kty": "RSA", "kid": "ps256", "alg": "PS256", "n": b64(&[0xc1; 256]), "e": "AQAB"}),
        json!({"kty": "oct", "kid": "secret", "k": "c2VjcmV0"}),
        json!({"kty": "RSA", "kid": "bad-b64", "n": "!!", "e": "AQAB"}),
        json!({"kty": "EC", "kid": "enc", "use": "enc", "crv": "P-256"}),
        json!({"kty": "EC", "crv": "P-256"}),
    ]);
    assert_eq!(keys.counts(), (6, 1), "{keys:?}");
    let as_issuer = |iss: serde_json::Value, kid: serde_json::Value| {
        es.sign(
            json!({"alg": "ES256", "kid": kid}),
            json!({"iss": iss, "sub": "x"}),
        )
    };
    for (name, token, want) in [
        (
            "another issuer",
            as_issuer(json!("https://oidc.example"), json!("k")),
            TokenCheck::Foreign,
        ),
        (
            "a legacy token's issuer",
            as_issuer(json!("kubernetes/serviceaccount"), json!("k")),
            TokenCheck::Foreign,
        ),
        (
            "no issuer",
            es.sign(json!({"alg": "ES256", "kid": "k"}), json!({"sub": "x"})),
            TokenCheck::Foreign,
        ),
        (
            "an issuer not a string",
            as_issuer(json!(5), json!("k")),
            TokenCheck::Foreign,
        ),
        (
            "a key not published",
            as_issuer(json!(ISSUER), json!("rotated")),
            TokenCheck::UnknownKey,
        ),
        (
            "a key for encryption",
            as_issuer(json!(ISSUER), json!("enc")),
            TokenCheck::UnknownKey,
        ),
        (
            "no kid",
            es.sign(json!({"alg": "ES256"}), json!({"iss": ISSUER})),
            TokenCheck::Refused(Flaw::UnknownKey),
        ),
        (
            "a kid not a string",
            as_issuer(json!(ISSUER), json!(["k"])),
            TokenCheck::Refused(Flaw::UnknownKey),
        ),
        (
            "P-521",
            as_issuer(json!(ISSUER), json!("p521")),
            TokenCheck::Unchecked,
        ),
        (
            "RSA 1024",
            as_issuer(json!(ISSUER), json!("rsa1024")),
            TokenCheck::Unchecked,
        ),
        (
            "PS256",
            as_issuer(json!(ISSUER), json!("ps256")),
            TokenCheck::Unchecked,
        ),
        (
            "symmetric",
            as_issuer(json!(ISSUER), json!("secret")),
            TokenCheck::Unchecked,
        ),
        (
            "malformed key",
            as_issuer(json!(ISSUER), json!("bad-b64")),
            TokenCheck::Unchecked,
        ),
    ] {
        assert_eq!(checked(&token, &keys), want, "{name}");
    }
}

#[test]
fn documents_are_bounded_and_checked() {
    let es = Signer::new("k");
    let (discovery, jwks) = documents(&[es.jwk()]);
    assert!(KeySet::parse(&discovery, &jwks).is_ok());
    let too_many: Vec<_> = (0..=KEYS_MAX).map(|_| es.jwk()).collect();
    let (_, many) = documents(&too_many);
    let huge = vec![b' '; DOCUMENT_MAX + 1];
    for (name, discovery, jwks) in [
        ("too many keys", discovery.clone(), many),
        ("a key set too large", discovery.clone(), huge.clone()),
        ("a discovery document too large", huge, jwks.clone()),
        ("no issuer", b"{}".to_vec(), jwks.clone()),
        (
            "an empty issuer",
            br#"{"issuer": ""}"#.to_vec(),
            jwks.clone(),
        ),
        ("not JSON", b"<html>".to_vec(), jwks.clone()),
        ("no keys", discovery.clone(), b"{}".to_vec()),
        (
            "keys not a list",
            discovery.clone(),
            br#"{"keys": {}}"#.to_vec(),
        ),
    ] {
        assert!(KeySet::parse(&discovery, &jwks).is_err(), "{name}");
    }
}

#[test]
fn only_json_objects_make_a_jwt() {
    let o = b64(b"{}");
    for (name, token) in [
        ("two segments", format!("{o}.{o}")),
        ("four segments", format!("{o}.{o}.{o}.{o}")),
        ("header not base64", format!("!.{o}.{o}")),
        ("header not JSON", format!("{}.{o}.", b64(b"alg"))),
        ("header an array", format!("{}.{o}.", b64(b"[1]"))),
        ("payload a string", format!("{o}.{}.", b64(b"\"x\""))),
        ("payload padded", format!("{o}.{o}=.")),
        ("signature not base64", format!("{o}.{o}.*")),
    ] {
        assert!(Jwt::parse(&token).is_err(), "{name}");
    }
    assert!(Jwt::parse(&format!("{o}.{o}.")).is_ok());
}

/// Junk of every shape (random bytes, random segments, JSON of the wrong types, tokens
/// claiming the issuer with made-up signatures and keys) is read and judged without a panic, and
/// nothing made up is ever found signed.
#[test]
fn junk_never_panics_and_is_never_signed() {
    let es = Signer::new("k");
    let keys = key_set(&[
        es.jwk(),
        serde_json::from_str(RSA_JWK).unwrap(),
        json!({"kty": "EC", "kid": "p521", "crv": "P-521"}),
    ]);
    let seed = 0x6a77_6b73;
    let mut rng = Rng(seed);
    let pieces: [&[u8]; 12] = [
        b"{",
        b"}",
        b"\"alg\":",
        b"\"ES256\"",
        b"\"RS256\"",
        b"\"kid\":\"k\"",
        b",",
        b"\"iss\":",
        ISSUER.as_bytes(),
        b"\"",
        b"1e309",
        b"null",
    ];
    for round in 0..20_000 {
        let segment = |rng: &mut Rng| -> String {
            match rng.below(4) {
                0 => b64(&(0..rng.below(80))
                    .map(|_| rng.next_u64() as u8)
                    .collect::<Vec<_>>()),
                1 => b64(&(0..rng.below(12))
                    .flat_map(|_| rng.pick(&pieces).to_vec())
                    .collect::<Vec<_>>()),
                2 => (0..rng.below(40))
                    .map(|_| rng.pick(&[b'a', b'-', b'_', b'.', b'=', b'+', b'/', 0xc3]) as char)
                    .collect(),
                _ => b64(
                    json!({"alg": rng.pick(&["ES256", "RS256", "ES384", "none", "HS256"]),
                                "kid": rng.pick(&["k", "rsa-fixture", "p521", "x"]),
                                "iss": ISSUER, "exp": NOW + 10.0})
                    .to_string()
                    .as_bytes(),
                ),
            }
        };
        let parts = 1 + rng.below(4);
        let token = (0..parts)
            .map(|_| segment(&mut rng))
            .collect::<Vec<_>>()
            .join(".");
        if let Ok(jwt) = Jwt::parse(&token) {
            let check = check(&jwt, &keys, NOW);
            assert_ne!(
                check,
                TokenCheck::Signed,
                "seed {seed} round {round}: {token}"
            );
        }
    }
    // Key sets of junk, too.
    for round in 0..2_000 {
        let values = [
            json!(null),
            json!(1),
            json!("AQAB"),
            json!(""),
            json!("!"),
            json!([]),
            json!(b64(&[0xff; 33])),
        ];
        let value = |rng: &mut Rng| values[rng.below(values.len())].clone();
        let key = json!({"kty": rng.pick(&["RSA", "EC", "x", ""]), "kid": "k", "crv": rng.pick(&["P-256", "P-384", "P-521"]),
                         "n": value(&mut rng), "e": value(&mut rng), "x": value(&mut rng), "y": value(&mut rng),
                         "alg": rng.pick(&["RS256", "ES256", "ES384", "none"])});
        let (discovery, jwks) = documents(&[key]);
        if let Ok(keys) = KeySet::parse(&discovery, &jwks) {
            let token = es.token("x", NOW);
            let j = check(&Jwt::parse(&token).unwrap(), &keys, NOW);
            assert_ne!(j, TokenCheck::Signed, "seed {seed} round {round}: {keys:?}");
        }
    }
}
