//! Credentials: the App JWT the fake verifies, the admin JWT it issues, and
//! the opaque tokens of the GitHub API side.
//!
//! The admin token is a real RS256 JWT with `exp` because clients parse its
//! expiry (without verifying it) to decide when to renew; a fake that handed
//! out an opaque string would let a client that never renews pass its tests.
//! The fake verifies the signature and expiry on every Actions call, so a
//! client that keeps using an expired token gets the 401 it would get live.

use http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::Rng as _;
use rand::distr::Alphanumeric;
use serde::{Deserialize, Serialize};

use crate::error::{ServiceError, StartError};

/// The RSA keys the fake works with.
pub(crate) struct Keys {
    /// Signs admin tokens.
    service_signing: EncodingKey,
    /// Verifies admin tokens.
    service_verifying: DecodingKey,
    /// Verifies the App JWTs clients sign with the App's private key.
    app_verifying: DecodingKey,
}

impl Keys {
    pub(crate) fn new(
        service_private_pem: &str,
        service_public_pem: &str,
        app_public_pem: &str,
    ) -> Result<Keys, StartError> {
        let bad = |which| move |source| StartError::BadKey { which, source };
        Ok(Keys {
            service_signing: EncodingKey::from_rsa_pem(service_private_pem.as_bytes())
                .map_err(bad("service signing key"))?,
            service_verifying: DecodingKey::from_rsa_pem(service_public_pem.as_bytes())
                .map_err(bad("service verifying key"))?,
            app_verifying: DecodingKey::from_rsa_pem(app_public_pem.as_bytes())
                .map_err(bad("App public key"))?,
        })
    }
}

/// Claims of the admin token the fake issues at runner-registration.
#[derive(Debug, Serialize, Deserialize)]
struct AdminClaims {
    iss: String,
    /// The tenant (one per configuration URL) the token is good for.
    tenant: u32,
    /// Tokens of an older generation are expired: the control API expires
    /// every issued token at once by bumping the generation.
    generation: u64,
    iat: i64,
    exp: i64,
}

const ISSUER: &str = "fake-actions";

/// Issues an admin token for `tenant`, valid for `lifetime_secs` from `now`.
pub(crate) fn issue_admin_token(
    keys: &Keys,
    tenant: u32,
    generation: u64,
    now: i64,
    lifetime_secs: i64,
) -> String {
    let claims = AdminClaims {
        iss: ISSUER.to_owned(),
        tenant,
        generation,
        iat: now,
        exp: now + lifetime_secs,
    };
    // Signing with a key that parsed at start-up does not fail.
    jsonwebtoken::encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &keys.service_signing,
    )
    .unwrap_or_default()
}

/// Checks an admin token and returns its tenant.
pub(crate) fn check_admin_token(
    keys: &Keys,
    token: &str,
    current_generation: u64,
) -> Result<u32, ServiceError> {
    let mut validation = Validation::new(Algorithm::RS256);
    // The fake decides expiry exactly, so tests of renewal are not blurred by
    // the library's default minute of leeway.
    validation.leeway = 0;
    validation.set_issuer(&[ISSUER]);
    validation.set_required_spec_claims(&["exp", "iss"]);
    let data = jsonwebtoken::decode::<AdminClaims>(token, &keys.service_verifying, &validation)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => ServiceError::TokenExpired,
            _ => ServiceError::InvalidCredentials,
        })?;
    if data.claims.generation < current_generation {
        return Err(ServiceError::TokenExpired);
    }
    Ok(data.claims.tenant)
}

/// Claims GitHub requires of an App JWT.
#[derive(Debug, Deserialize)]
struct AppClaims {
    iss: serde_json::Value,
    iat: i64,
    exp: i64,
}

/// Checks a GitHub App JWT: RS256, signed by the App key, issued by the App
/// (its id or client id), not expired, and no longer than the ten minutes
/// GitHub allows.
pub(crate) fn check_app_jwt(
    keys: &Keys,
    token: &str,
    app_id: u64,
    client_id: &str,
) -> Result<(), ServiceError> {
    let mut validation = Validation::new(Algorithm::RS256);
    // `iss` is checked below: GitHub accepts it as a number (the App id) or
    // a string (either id), and the library only parses strings.
    validation.set_required_spec_claims(&["exp"]);
    let data = jsonwebtoken::decode::<AppClaims>(token, &keys.app_verifying, &validation).map_err(
        |e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => ServiceError::TokenExpired,
            _ => ServiceError::InvalidCredentials,
        },
    )?;
    let issuer = match &data.claims.iss {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return Err(ServiceError::InvalidCredentials),
    };
    if issuer != app_id.to_string() && issuer != client_id {
        return Err(ServiceError::InvalidCredentials);
    }
    if data.claims.exp - data.claims.iat > 600 {
        return Err(ServiceError::BadRequest(
            "the App JWT's expiry is more than ten minutes after its issue time".into(),
        ));
    }
    Ok(())
}

/// The token of an `Authorization: <scheme> <token>` header, for any of the
/// given schemes (case-insensitive, as GitHub accepts `token` and `Bearer`).
pub(crate) fn credential<'h>(headers: &'h HeaderMap, schemes: &[&str]) -> Option<&'h str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    schemes
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
        .then(|| token.trim())
}

/// A random opaque token with a recognisable prefix (`ghs_`, `AAR`...).
pub(crate) fn random_token(prefix: &str) -> String {
    let body: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(36)
        .map(char::from)
        .collect();
    format!("{prefix}{body}")
}

/// A random UUID-shaped id, as session ids are.
pub(crate) fn random_uuid() -> String {
    let b: [u8; 16] = rand::rng().random();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        TEST_APP_PRIVATE_KEY, TEST_APP_PUBLIC_KEY, TEST_SERVICE_KEY, TEST_SERVICE_PUBLIC_KEY,
    };

    fn keys() -> Keys {
        Keys::new(
            TEST_SERVICE_KEY,
            TEST_SERVICE_PUBLIC_KEY,
            TEST_APP_PUBLIC_KEY,
        )
        .unwrap()
    }

    #[test]
    fn admin_tokens_carry_their_tenant_and_expire() {
        let keys = keys();
        let now = jiff::Timestamp::now().as_second();
        let token = issue_admin_token(&keys, 3, 0, now, 600);
        assert_eq!(check_admin_token(&keys, &token, 0), Ok(3));
        // A later generation expires it.
        assert_eq!(
            check_admin_token(&keys, &token, 1),
            Err(ServiceError::TokenExpired)
        );
        let stale = issue_admin_token(&keys, 3, 0, now - 1000, 600);
        assert_eq!(
            check_admin_token(&keys, &stale, 0),
            Err(ServiceError::TokenExpired)
        );
        assert_eq!(
            check_admin_token(&keys, "not-a-jwt", 0),
            Err(ServiceError::InvalidCredentials)
        );
    }

    #[test]
    fn app_jwts_are_checked_against_the_public_key_and_issuer() {
        let keys = keys();
        let now = jiff::Timestamp::now().as_second();
        let sign = |iss: serde_json::Value, iat: i64, exp: i64, pem: &str| {
            let key = EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap();
            let claims = serde_json::json!({"iss": iss, "iat": iat, "exp": exp});
            jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap()
        };
        let good = sign(
            serde_json::json!(42),
            now - 60,
            now + 540,
            TEST_APP_PRIVATE_KEY,
        );
        assert_eq!(check_app_jwt(&keys, &good, 42, "Iv1.abc"), Ok(()));
        let by_client_id = sign(
            serde_json::json!("Iv1.abc"),
            now - 60,
            now + 540,
            TEST_APP_PRIVATE_KEY,
        );
        assert_eq!(check_app_jwt(&keys, &by_client_id, 42, "Iv1.abc"), Ok(()));
        assert_eq!(
            check_app_jwt(&keys, &good, 43, "Iv1.other"),
            Err(ServiceError::InvalidCredentials)
        );
        let wrong_key = sign(serde_json::json!(42), now - 60, now + 540, TEST_SERVICE_KEY);
        assert_eq!(
            check_app_jwt(&keys, &wrong_key, 42, "Iv1.abc"),
            Err(ServiceError::InvalidCredentials)
        );
        let too_long = sign(serde_json::json!(42), now, now + 3600, TEST_APP_PRIVATE_KEY);
        assert!(matches!(
            check_app_jwt(&keys, &too_long, 42, "Iv1.abc"),
            Err(ServiceError::BadRequest(_))
        ));
    }

    #[test]
    fn credentials_are_read_by_scheme() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, "token abc".parse().unwrap());
        assert_eq!(credential(&headers, &["bearer", "token"]), Some("abc"));
        assert_eq!(credential(&headers, &["RemoteAuth"]), None);
        assert_eq!(random_uuid().len(), 36);
    }
}
