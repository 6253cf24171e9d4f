//! An error as an admin reads it on a status or in an event: the whole
//! chain of causes on one line.
//!
//! A transport error's own text is `error sending request`; why it failed
//! (a certificate the host refused, a connection reset, a name that does
//! not resolve) is its source's source, and a status that says only the
//! first line sends the admin to the host's log, or nowhere. Errors built
//! with thiserror often repeat their source in their own text
//! (`"...: {source}"`), so a cause whose text is already said is not said
//! again.

use std::error::Error;

/// `error`, then each cause not already in the text, joined by `": "`.
pub fn of(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{what}")]
    struct Link {
        what: &'static str,
        #[source]
        cause: Option<Box<Link>>,
    }

    fn chain(texts: &[&'static str]) -> Link {
        texts
            .iter()
            .rev()
            .fold(None, |cause, what| {
                Some(Link {
                    what,
                    cause: cause.map(Box::new),
                })
            })
            .expect("at least one link")
    }

    #[test]
    fn every_cause_is_said_once() {
        let error = chain(&[
            "creating the scale set: error sending request",
            "error sending request",
            "client error (Connect)",
            "invalid peer certificate: UnknownIssuer",
        ]);
        assert_eq!(
            of(&error),
            "creating the scale set: error sending request: client error (Connect): \
             invalid peer certificate: UnknownIssuer"
        );
    }

    #[test]
    fn an_error_without_a_cause_is_its_own_text() {
        assert_eq!(
            of(&chain(&["secret ns/creds does not exist"])),
            "secret ns/creds does not exist"
        );
    }
}
