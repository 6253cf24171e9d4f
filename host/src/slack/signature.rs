//! Slack's request signature (`v0`): an HMAC-SHA256, keyed with the app's
//! signing secret, over `v0:{timestamp}:{body}`, sent as `X-Slack-Signature:
//! v0=<hex>` with the timestamp in `X-Slack-Request-Timestamp`.
//!
//! A request is accepted only if its timestamp is within five minutes of
//! now (so a captured request cannot be replayed later) and the signature
//! matches, compared in constant time (so the comparison's speed says
//! nothing about how much of a forged signature was right).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a request's timestamp may be from now, either way (Slack's
/// recommendation).
pub const REPLAY_WINDOW_SECS: i64 = 5 * 60;

/// Why a request was refused. Says nothing about the expected signature.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A header is missing.
    #[error("the request has no {0} header")]
    Missing(&'static str),
    /// The timestamp is not a number of seconds.
    #[error("the request timestamp is not a number")]
    BadTimestamp,
    /// The timestamp is outside the replay window.
    #[error("the request timestamp is more than five minutes from now")]
    Stale,
    /// The signature is not `v0=` and hex.
    #[error("the request signature is not of the form v0=<hex>")]
    Malformed,
    /// The signature does not match.
    #[error("the request signature does not match")]
    Mismatch,
}

/// Checks a request's signature; `now` is the current Unix time in seconds.
pub fn verify(
    signing_secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let timestamp = timestamp.ok_or(SignatureError::Missing("X-Slack-Request-Timestamp"))?;
    let signature = signature.ok_or(SignatureError::Missing("X-Slack-Signature"))?;
    let sent: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    if now.abs_diff(sent) > REPLAY_WINDOW_SECS.unsigned_abs() {
        return Err(SignatureError::Stale);
    }
    let hex_part = signature
        .strip_prefix("v0=")
        .ok_or(SignatureError::Malformed)?;
    let given = hex::decode(hex_part).map_err(|_| SignatureError::Malformed)?;
    mac(signing_secret, timestamp.trim(), body)
        .verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)
}

fn mac(signing_secret: &[u8], timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    // Any key length is valid for HMAC; this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(signing_secret)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slack's documented example request.
    const SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
    const TIMESTAMP: &str = "1531420618";
    const BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SIGNATURE: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    const NOW: i64 = 1_531_420_618;

    #[test]
    fn slacks_example_verifies() {
        assert_eq!(
            verify(SECRET, Some(TIMESTAMP), Some(SIGNATURE), BODY, NOW),
            Ok(())
        );
    }

    /// A case: name, secret, timestamp, signature, body, now, the refusal.
    type Row<'a> = (
        &'a str,
        &'a [u8],
        Option<&'a str>,
        Option<&'a str>,
        &'a [u8],
        i64,
        SignatureError,
    );

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        let mut flipped = SIGNATURE.to_string();
        flipped.replace_range(66..67, if SIGNATURE.ends_with('0') { "1" } else { "0" });
        let rows: Vec<Row<'_>> = vec![
            (
                "another secret",
                b"not-the-secret",
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                NOW,
                SignatureError::Mismatch,
            ),
            (
                "another body",
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                b"token=x",
                NOW,
                SignatureError::Mismatch,
            ),
            (
                "one digit changed",
                SECRET,
                Some(TIMESTAMP),
                Some(flipped.as_str()),
                BODY,
                NOW,
                SignatureError::Mismatch,
            ),
            (
                "a truncated signature",
                SECRET,
                Some(TIMESTAMP),
                Some(&SIGNATURE[..41]),
                BODY,
                NOW,
                SignatureError::Mismatch,
            ),
            (
                "another timestamp in the window",
                SECRET,
                Some("1531420619"),
                Some(SIGNATURE),
                BODY,
                NOW,
                SignatureError::Mismatch,
            ),
            (
                "no signature",
                SECRET,
                Some(TIMESTAMP),
                None,
                BODY,
                NOW,
                SignatureError::Missing("X-Slack-Signature"),
            ),
            (
                "no timestamp",
                SECRET,
                None,
                Some(SIGNATURE),
                BODY,
                NOW,
                SignatureError::Missing("X-Slack-Request-Timestamp"),
            ),
            (
                "not v0",
                SECRET,
                Some(TIMESTAMP),
                Some("v1=abcd"),
                BODY,
                NOW,
                SignatureError::Malformed,
            ),
            (
                "not hex",
                SECRET,
                Some(TIMESTAMP),
                Some("v0=zz"),
                BODY,
                NOW,
                SignatureError::Malformed,
            ),
            (
                "a word for a timestamp",
                SECRET,
                Some("soon"),
                Some(SIGNATURE),
                BODY,
                NOW,
                SignatureError::BadTimestamp,
            ),
            (
                "five minutes and a second old",
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                NOW + 301,
                SignatureError::Stale,
            ),
            (
                "from the future",
                SECRET,
                Some(TIMESTAMP),
                Some(SIGNATURE),
                BODY,
                NOW - 301,
                SignatureError::Stale,
            ),
        ];
        for (name, secret, timestamp, signature, body, now, want) in rows {
            assert_eq!(
                verify(secret, timestamp, signature, body, now),
                Err(want),
                "{name}"
            );
        }
        // The edge of the window is inside it.
        assert_eq!(
            verify(SECRET, Some(TIMESTAMP), Some(SIGNATURE), BODY, NOW + 300),
            Ok(())
        );
    }
}
