//! Credentials and the tokens derived from them.
//!
//! The bootstrap is a chain of three exchanges, each for a shorter-lived
//! token: a PAT (or an App's installation token, itself minted with a
//! ten-minute JWT) buys a one-hour registration token, which buys an Actions
//! service URL and an admin token. This module holds the types and the pure
//! steps (signing the App JWT, reading the admin token's expiry, deciding
//! when to renew); the client does the HTTP.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use url::Url;

use super::ActionsError;

/// A credential or token: usable, never printed.
///
/// `Debug` shows `Secret([redacted])` and there is deliberately no `Display`,
/// so a secret cannot reach a log line, an error or an event by accident; the
/// only way to the value is [`Secret::expose`], which is easy to audit.
///
/// It does serialise as its plain value: secrets are part of the wire format
/// (a session's queue token, a JIT configuration), so a type holding one may
/// be serialised into a request or a Kubernetes Secret, never into a log.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that has to send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the secret is empty (an empty token is never valid).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_string())
    }
}

/// How the client authenticates to the GitHub API.
#[derive(Clone)]
pub enum Credentials {
    /// A personal access token (classic, `admin:org` / `repo` /
    /// `manage_runners:enterprise` as the scope needs).
    Token(Secret),
    /// A GitHub App installation.
    App(AppCredentials),
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Token(_) => f.write_str("Credentials::Token([redacted])"),
            Self::App(app) => f.debug_tuple("Credentials::App").field(app).finish(),
        }
    }
}

/// A GitHub App installation: who the App is, where it is installed, and
/// the key it signs its JWTs with.
#[derive(Clone)]
pub struct AppCredentials {
    issuer: String,
    installation_id: u64,
    key: jsonwebtoken::EncodingKey,
}

impl fmt::Debug for AppCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppCredentials")
            .field("issuer", &self.issuer)
            .field("installation_id", &self.installation_id)
            .field("private_key", &"[redacted]")
            .finish()
    }
}

/// Claims of the JWT an App authenticates with.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct AppClaims {
    pub(crate) iss: String,
    pub(crate) iat: i64,
    pub(crate) exp: i64,
}

impl AppCredentials {
    /// Builds App credentials from the App's id or client id (either is
    /// accepted as the JWT issuer), the installation id and the PEM private
    /// key GitHub issued (PKCS#1 or PKCS#8).
    ///
    /// The key is tried by signing one JWT here, so a truncated or mangled
    /// key is reported when the credentials are loaded rather than at the
    /// first bootstrap, which may be much later.
    pub fn new(
        app_id_or_client_id: impl Into<String>,
        installation_id: u64,
        private_key_pem: &str,
    ) -> Result<Self, ActionsError> {
        let issuer = app_id_or_client_id.into();
        if issuer.trim().is_empty() {
            return Err(ActionsError::InvalidCredentials(
                "the App id is empty".into(),
            ));
        }
        if installation_id == 0 {
            return Err(ActionsError::InvalidCredentials(
                "the App installation id is 0".into(),
            ));
        }
        let key =
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem.as_bytes()).map_err(|e| {
                ActionsError::InvalidCredentials(format!(
                    "the App private key is not an RSA key in PEM form: {e}"
                ))
            })?;
        let credentials = Self {
            issuer,
            installation_id,
            key,
        };
        credentials.jwt(Timestamp::now())?;
        Ok(credentials)
    }

    /// The JWT issuer: the App id or client id.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The installation the App acts as.
    pub fn installation_id(&self) -> u64 {
        self.installation_id
    }

    /// Signs the JWT that buys an installation token.
    ///
    /// `iat` is backdated 60 s so a clock slightly ahead of GitHub's is not
    /// rejected as "issued in the future", and `exp` is nine minutes after
    /// `iat`, inside GitHub's ten-minute limit with room for skew the other
    /// way.
    pub(crate) fn jwt(&self, now: Timestamp) -> Result<Secret, ActionsError> {
        let iat = now.as_second() - 60;
        let claims = AppClaims {
            iss: self.issuer.clone(),
            iat,
            exp: iat + 9 * 60,
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map(Secret)
            .map_err(|e| {
                ActionsError::InvalidCredentials(format!("the App JWT cannot be signed: {e}"))
            })
    }
}

/// How long before the admin token's expiry it is no longer used: a call
/// that finds only such a token waits for a fresh one, so no request leaves
/// with a token that expires on the way.
pub const ADMIN_TOKEN_RENEWAL_MARGIN: Duration = Duration::from_secs(60);

/// How long before the admin token's expiry a renewal starts in the
/// background while the current token goes on serving.
///
/// Renewing only when the token is unusable would make every call that
/// arrives during the bootstrap wait for it, and a bootstrap is three calls
/// to GitHub, each with its retries: while GitHub is slow, every scale set
/// on the credential would stall at once. Five minutes is room for a slow
/// bootstrap and its retries to finish before the margin is reached.
pub const ADMIN_TOKEN_RENEWAL_WINDOW: Duration = Duration::from_secs(5 * 60);

/// The least time between two background renewals. A renewal that failed
/// is not tried again on the very next call (the current token still
/// serves), and a service that issues tokens shorter than the renewal window
/// costs one bootstrap per spacing, not one per call.
pub const ADMIN_TOKEN_RENEWAL_SPACING: Duration = Duration::from_secs(30);

/// What a call does about the admin token the client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPlan {
    /// Use it.
    Use,
    /// Use it, and start a renewal in the background.
    UseAndRenew,
    /// There is no usable token: wait for a bootstrap (joining the one under
    /// way, if any).
    Wait,
}

/// Decides what a call does about the admin token: `token` is the one held,
/// `last_background_renewal` when the last background renewal started.
pub fn plan_admin_token(
    token: Option<&AdminToken>,
    now: Timestamp,
    last_background_renewal: Option<Timestamp>,
) -> TokenPlan {
    let Some(token) = token else {
        return TokenPlan::Wait;
    };
    if token.needs_renewal(now) {
        return TokenPlan::Wait;
    }
    let window = ADMIN_TOKEN_RENEWAL_WINDOW.as_secs() as i64;
    let spacing = ADMIN_TOKEN_RENEWAL_SPACING.as_secs() as i64;
    let in_window = now.as_second() + window >= token.expires_at.as_second();
    let spaced =
        last_background_renewal.is_none_or(|last| now.as_second() >= last.as_second() + spacing);
    if in_window && spaced {
        TokenPlan::UseAndRenew
    } else {
        TokenPlan::Use
    }
}

/// What `runner-registration` returns: where the Actions service is and the
/// token to call it with.
#[derive(Clone, Debug)]
pub struct AdminToken {
    /// The Actions service base URL, ending in `/`.
    pub service_url: Url,
    /// The bearer token for the Actions service.
    pub token: Secret,
    /// The token's `exp` claim.
    pub expires_at: Timestamp,
}

impl AdminToken {
    /// Whether the token is too close to its expiry to be used for another
    /// request ([`ADMIN_TOKEN_RENEWAL_MARGIN`]).
    pub fn needs_renewal(&self, now: Timestamp) -> bool {
        let margin = ADMIN_TOKEN_RENEWAL_MARGIN.as_secs() as i64;
        now.as_second() + margin >= self.expires_at.as_second()
    }
}

/// Reads the `exp` claim of a JWT without verifying its signature.
///
/// The client is not the audience of the admin token and has no key to
/// verify it with; it only needs to know when to fetch a new one. A token
/// that is not a JWT with a numeric `exp` is an error rather than "never
/// expires", because renewing too late breaks every listener at once.
pub fn jwt_expiry(token: &str) -> Result<Timestamp, ActionsError> {
    let bad = |why: &str| ActionsError::InvalidAdminToken(why.to_string());
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("it is not a JWT (three dot-separated parts)"));
    };
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|_| bad("its payload is not base64url"))?;
    #[derive(Deserialize)]
    struct Exp {
        exp: Option<serde_json::Number>,
    }
    let claims: Exp =
        serde_json::from_slice(&payload).map_err(|_| bad("its payload is not a JSON object"))?;
    let exp = claims.exp.ok_or_else(|| bad("it has no exp claim"))?;
    let seconds = exp
        .as_i64()
        .or_else(|| exp.as_f64().map(|f| f as i64))
        .ok_or_else(|| bad("its exp claim is not a number"))?;
    Timestamp::from_second(seconds).map_err(|_| bad("its exp claim is out of range"))
}

/// A token response from the GitHub API (installation and registration
/// tokens share the shape).
#[derive(Debug, Deserialize)]
pub(crate) struct TokenResponse {
    pub(crate) token: Secret,
}

/// The `runner-registration` response.
#[derive(Debug, Deserialize)]
pub(crate) struct RegistrationResponse {
    pub(crate) url: String,
    pub(crate) token: Secret,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test RSA key (PKCS#1, as GitHub issues them) that protects nothing.
    const TEST_KEY: &str = fake_actions::TEST_APP_PRIVATE_KEY;

    fn jwt_with(payload: &str) -> String {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", enc(r#"{"alg":"RS256"}"#), enc(payload))
    }

    #[test]
    fn expiry_is_read_from_the_payload() {
        let exp = jwt_expiry(&jwt_with(r#"{"exp":1767225600,"sub":"x"}"#)).unwrap();
        assert_eq!(exp, "2026-01-01T00:00:00Z".parse::<Timestamp>().unwrap());
        // Some issuers write exp as a float.
        let exp = jwt_expiry(&jwt_with(r#"{"exp":1767225600.0}"#)).unwrap();
        assert_eq!(exp.as_second(), 1_767_225_600);
    }

    #[test]
    fn tokens_without_a_readable_exp_are_rejected_without_echoing_them() {
        for token in [
            "opaque-token-value".to_string(),
            "a.b".to_string(),
            "a.!!!.c".to_string(),
            jwt_with("not json"),
            jwt_with(r#"{"sub":"x"}"#),
            jwt_with(r#"{"exp":"tomorrow"}"#),
        ] {
            let err = jwt_expiry(&token).expect_err(&token);
            assert!(matches!(err, ActionsError::InvalidAdminToken(_)));
            assert!(!err.to_string().contains(&token), "{err}");
        }
    }

    #[test]
    fn renewal_starts_a_minute_before_expiry() {
        let expires_at: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let token = AdminToken {
            service_url: Url::parse("https://pipelines.example/tenant/").unwrap(),
            token: Secret::new("t"),
            expires_at,
        };
        assert!(!token.needs_renewal("2026-01-01T00:08:59Z".parse().unwrap()));
        assert!(token.needs_renewal("2026-01-01T00:09:00Z".parse().unwrap()));
        assert!(token.needs_renewal("2026-01-01T00:11:00Z".parse().unwrap()));
    }

    #[test]
    fn a_usable_token_serves_while_it_is_renewed() {
        use TokenPlan::{Use, UseAndRenew, Wait};
        let token = AdminToken {
            service_url: Url::parse("https://pipelines.example/tenant/").unwrap(),
            token: Secret::new("t"),
            expires_at: "2026-01-01T01:00:00Z".parse().unwrap(),
        };
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        // (now, last background renewal, plan)
        let table = [
            // Well before the window: used as it is.
            ("2026-01-01T00:10:00Z", None, Use),
            ("2026-01-01T00:54:59Z", None, Use),
            // In the window: used, and renewed in the background.
            ("2026-01-01T00:55:00Z", None, UseAndRenew),
            ("2026-01-01T00:58:59Z", None, UseAndRenew),
            // ... but not again within the spacing of the last renewal.
            ("2026-01-01T00:56:00Z", Some("2026-01-01T00:55:40Z"), Use),
            (
                "2026-01-01T00:56:10Z",
                Some("2026-01-01T00:55:40Z"),
                UseAndRenew,
            ),
            // Within the margin the token is not used: wait for a fresh one.
            ("2026-01-01T00:59:00Z", None, Wait),
            ("2026-01-01T00:59:00Z", Some("2026-01-01T00:58:59Z"), Wait),
            ("2026-01-01T02:00:00Z", None, Wait),
        ];
        for (now, last, expected) in table {
            assert_eq!(
                plan_admin_token(Some(&token), at(now), last.map(at)),
                expected,
                "{now} last renewal {last:?}"
            );
        }
        assert_eq!(
            plan_admin_token(None, at("2026-01-01T00:00:00Z"), None),
            Wait
        );
    }

    #[test]
    fn app_jwt_has_backdated_iat_and_nine_minute_lifetime() {
        let app = AppCredentials::new("Iv1.abc", 42, TEST_KEY).unwrap();
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let jwt = app.jwt(now).unwrap();
        let parts: Vec<&str> = jwt.expose().split('.').collect();
        let header: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts[0])
                .unwrap(),
        )
        .unwrap();
        assert_eq!(header["alg"], "RS256");
        let claims: AppClaims = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts[1])
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            claims,
            AppClaims {
                iss: "Iv1.abc".into(),
                iat: now.as_second() - 60,
                exp: now.as_second() + 480
            }
        );
        assert_eq!(jwt_expiry(jwt.expose()).unwrap().as_second(), claims.exp);
    }

    #[test]
    fn bad_app_credentials_are_reported_at_load() {
        let err = AppCredentials::new(
            "1",
            42,
            "-----BEGIN RSA PRIVATE KEY-----\nnope\n-----END RSA PRIVATE KEY-----\n",
        )
        .expect_err("bad key");
        assert!(matches!(err, ActionsError::InvalidCredentials(_)), "{err}");
        assert!(AppCredentials::new("", 42, TEST_KEY).is_err());
        assert!(AppCredentials::new("1", 0, TEST_KEY).is_err());
    }
}
