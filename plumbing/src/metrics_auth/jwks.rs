//! What the ServiceAccount issuer's published keys say of a bearer token, decided here without
//! I/O: a token that claims the issuer is checked (signature, expiry) before the apiserver is
//! asked, so a made-up one costs no API call and no budget.
//!
//! The keys are the apiserver's `/openid/v1/jwks`, the issuer its
//! `/.well-known/openid-configuration`'s `issuer`. RS256 (RSA keys of 2048 to 8192 bits), ES256
//! (P-256) and ES384 (P-384) are checked; a key of any other kind is kept as one this process
//! can not check, and a token signed with it goes to the apiserver as any other token does.

use base64::{
    Engine,
    alphabet::URL_SAFE,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde_json::{Map, Value};

/// The longest key set or discovery document read from the apiserver.
pub const DOCUMENT_MAX: usize = 128 << 10;
/// The most keys a key set may hold: a cluster publishes one or two (more while it rotates).
pub const KEYS_MAX: usize = 64;
/// How far `exp` and `nbf` may be off this process's clock: the clocks of nodes and the
/// apiserver differ, and a token refused here is one the apiserver never sees.
pub const LEEWAY_SECS: f64 = 300.0;

/// base64url without padding, as JWS segments are written; trailing bits are not judged (the
/// apiserver does not judge them either).
const B64: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// A bearer token read as a JWT: JSON objects as header and payload, and a signature.
#[derive(Debug)]
pub struct Jwt<'a> {
    /// `header.payload`, what the signature is over.
    signed: &'a str,
    signature: Vec<u8>,
    alg: Option<String>,
    kid: Option<String>,
    iss: Option<String>,
    exp: Option<Value>,
    nbf: Option<Value>,
}

/// Not a JWT: three base64url segments, the first two JSON objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl<'a> Jwt<'a> {
    /// Reads `token`, of bounded length (the caller caps it): linear in its length, never a
    /// panic.
    pub fn parse(token: &'a str) -> Result<Self, Malformed> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Malformed("not three segments"));
        };
        let object = |segment: &str, what: &'static str| -> Result<Map<String, Value>, Malformed> {
            let bytes = B64.decode(segment).map_err(|_| Malformed(what))?;
            match serde_json::from_slice(&bytes) {
                Ok(Value::Object(m)) => Ok(m),
                _ => Err(Malformed(what)),
            }
        };
        let mut header = object(header, "the header is not base64url JSON")?;
        let mut payload = object(payload, "the payload is not base64url JSON")?;
        let signature = B64
            .decode(signature)
            .map_err(|_| Malformed("the signature is not base64url"))?;
        let text = |m: &mut Map<String, Value>, k: &str| match m.remove(k) {
            Some(Value::String(s)) => Some(s),
            _ => None,
        };
        Ok(Self {
            signed: &token[..token.rfind('.').unwrap_or(0)],
            signature,
            alg: text(&mut header, "alg"),
            kid: text(&mut header, "kid"),
            iss: text(&mut payload, "iss"),
            exp: payload.remove("exp"),
            nbf: payload.remove("nbf"),
        })
    }

    pub fn issuer(&self) -> Option<&str> {
        self.iss.as_deref()
    }
}

/// A public key of the issuer, as this process checks signatures with it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// RS256: the modulus and exponent, big-endian, no leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// ES256: the uncompressed point (0x04, x, y).
    P256(Vec<u8>),
    /// ES384: the uncompressed point.
    P384(Vec<u8>),
    /// A key this process can not check (another type, curve or size, or a malformed one): a
    /// token signed with it is left to the apiserver.
    Unchecked,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Jwk {
    kid: String,
    key: Key,
}

/// The issuer and its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    pub issuer: String,
    keys: Vec<Jwk>,
}

impl KeySet {
    /// The issuer named by a discovery document, and the keys of a JWKS document.
    pub fn parse(discovery: &[u8], jwks: &[u8]) -> Result<Self, String> {
        if discovery.len() > DOCUMENT_MAX || jwks.len() > DOCUMENT_MAX {
            return Err(format!("a document over {DOCUMENT_MAX} bytes"));
        }
        let discovery: Value = serde_json::from_slice(discovery)
            .map_err(|e| format!("the discovery document is not JSON: {e}"))?;
        let issuer = match discovery.get("issuer") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err("the discovery document names no issuer".into()),
        };
        let jwks: Value =
            serde_json::from_slice(jwks).map_err(|e| format!("the key set is not JSON: {e}"))?;
        let Some(Value::Array(entries)) = jwks.get("keys") else {
            return Err("the key set has no keys".into());
        };
        if entries.len() > KEYS_MAX {
            return Err(format!(
                "the key set has {} keys, over {KEYS_MAX}",
                entries.len()
            ));
        }
        let keys = entries.iter().filter_map(jwk).collect();
        Ok(Self { issuer, keys })
    }

    /// How many keys there are, and how many this process can check.
    pub fn counts(&self) -> (usize, usize) {
        let checked = self.keys.iter().filter(|k| k.key != Key::Unchecked).count();
        (self.keys.len(), checked)
    }
}

/// One JWK: its `kid` and the key, [`Key::Unchecked`] when this process can not check it.
/// `None` for an entry with no `kid` (no token could name it) or not for signatures.
fn jwk(entry: &Value) -> Option<Jwk> {
    let kid = entry.get("kid")?.as_str()?.to_string();
    let field = |k: &str| entry.get(k).and_then(Value::as_str);
    if field("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let bytes = |k: &str| field(k).and_then(|v| B64.decode(v).ok());
    let alg_is = |want: &str| field("alg").is_none_or(|a| a == want);
    let key = match (field("kty"), field("crv")) {
        (Some("RSA"), _) if alg_is("RS256") => match (bytes("n"), bytes("e")) {
            (Some(n), Some(e)) => rsa(n, e).unwrap_or(Key::Unchecked),
            _ => Key::Unchecked,
        },
        (Some("EC"), Some(crv)) => match (crv, bytes("x"), bytes("y")) {
            ("P-256", Some(x), Some(y)) if alg_is("ES256") && x.len() == 32 && y.len() == 32 => {
                Key::P256([&[4u8][..], &x, &y].concat())
            }
            ("P-384", Some(x), Some(y)) if alg_is("ES384") && x.len() == 48 && y.len() == 48 => {
                Key::P384([&[4u8][..], &x, &y].concat())
            }
            _ => Key::Unchecked,
        },
        _ => Key::Unchecked,
    };
    Some(Jwk { kid, key })
}

/// An RSA key ring checks (2048 to 8192 bits, an odd exponent from 3 below 2^33), else `None`.
fn rsa(n: Vec<u8>, e: Vec<u8>) -> Option<Key> {
    let trim = |v: Vec<u8>| v.into_iter().skip_while(|b| *b == 0).collect::<Vec<u8>>();
    let (n, e) = (trim(n), trim(e));
    let bits = |v: &[u8]| {
        v.first()
            .map_or(0, |b| (v.len() - 1) * 8 + (8 - b.leading_zeros() as usize))
    };
    let e_value = (e.len() <= 5).then(|| e.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)))?;
    ((2048..=8192).contains(&bits(&n)) && (3..(1 << 33)).contains(&e_value) && e_value % 2 == 1)
        .then_some(Key::Rsa { n, e })
}

/// What the keys say of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCheck {
    /// Not of the ServiceAccount issuer (another issuer, or none): the apiserver decides, on
    /// the budget of tokens never seen.
    Foreign,
    /// Signed by the issuer's key and valid now: the apiserver decides (a ServiceAccount or
    /// bound object deleted since), on the budget of ServiceAccount tokens.
    Signed,
    /// Signed with a key this process can not check: the apiserver decides, as for a foreign
    /// token.
    Unchecked,
    /// Names a key the set does not hold: the keys may have changed since they were read.
    UnknownKey,
    /// Refused here, without asking the apiserver.
    Refused(Flaw),
}

/// Why a token of the ServiceAccount issuer is refused without asking the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// The signature does not verify with the key it names, or its algorithm is not the key's
    /// (`none`, HS256 ...).
    BadSignature,
    /// Names no key, or one the issuer does not publish (after reading the keys again).
    UnknownKey,
    /// `exp` is past, or not a number.
    Expired,
    /// `nbf` is to come, or not a number.
    NotYetValid,
}

impl Flaw {
    /// The `reason` label of `groundskeeper_metrics_auth_refused_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Flaw::BadSignature => "bad_signature",
            Flaw::UnknownKey => "unknown_key",
            Flaw::Expired => "expired",
            Flaw::NotYetValid => "not_yet_valid",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Flaw::BadSignature => {
                "the token's signature does not verify with the ServiceAccount issuer's keys\n"
            }
            Flaw::UnknownKey => "the token names no key the ServiceAccount issuer publishes\n",
            Flaw::Expired => "the token has expired\n",
            Flaw::NotYetValid => "the token is not valid yet\n",
        }
    }
}

/// Judges `jwt` by `keys` at `now` (seconds since the Unix epoch). The signature is judged
/// before the times, so a made-up token is never said to be merely expired.
pub fn check(jwt: &Jwt<'_>, keys: &KeySet, now: f64) -> TokenCheck {
    if jwt.iss.as_deref() != Some(keys.issuer.as_str()) {
        return TokenCheck::Foreign;
    }
    // The apiserver names its key in every token it signs; trying every key for a token that
    // names none would let one request cost as many verifications as there are keys.
    let Some(kid) = &jwt.kid else {
        return TokenCheck::Refused(Flaw::UnknownKey);
    };
    let Some(key) = keys.keys.iter().find(|k| &k.kid == kid) else {
        return TokenCheck::UnknownKey;
    };
    let message = jwt.signed.as_bytes();
    let verified = match (&key.key, jwt.alg.as_deref()) {
        (Key::Unchecked, _) => return TokenCheck::Unchecked,
        (Key::Rsa { n, e }, Some("RS256")) => RsaPublicKeyComponents { n, e }
            .verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                message,
                &jwt.signature,
            )
            .is_ok(),
        (Key::P256(point), Some("ES256")) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, &jwt.signature)
                .is_ok()
        }
        (Key::P384(point), Some("ES384")) => {
            UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                .verify(message, &jwt.signature)
                .is_ok()
        }
        _ => false,
    };
    if !verified {
        return TokenCheck::Refused(Flaw::BadSignature);
    }
    let seconds = |v: &Option<Value>| v.as_ref().map(|v| v.as_f64().unwrap_or(f64::NAN));
    if let Some(exp) = seconds(&jwt.exp)
        && (exp.is_nan() || exp + LEEWAY_SECS < now)
    {
        return TokenCheck::Refused(Flaw::Expired);
    }
    if let Some(nbf) = seconds(&jwt.nbf)
        && (nbf.is_nan() || nbf - LEEWAY_SECS > now)
    {
        return TokenCheck::Refused(Flaw::NotYetValid);
    }
    TokenCheck::Signed
}
