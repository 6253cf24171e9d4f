//! The GitHub configuration URL: which scope runners register in, and where
//! that host's REST API lives.

use std::fmt;

use url::Url;

use super::ActionsError;

/// Where runners register: the path part of the configuration URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `https://<host>/enterprises/<enterprise>`.
    Enterprise {
        /// The enterprise slug.
        enterprise: String,
    },
    /// `https://<host>/<organization>`.
    Organization {
        /// The organisation login.
        organization: String,
    },
    /// `https://<host>/<owner>/<repository>`.
    Repository {
        /// The owner (user or organisation) login.
        owner: String,
        /// The repository name.
        repository: String,
    },
}

/// A parsed `githubConfigUrl`.
///
/// Parsing happens once, when the client is built, so a typo in a manifest
/// fails at the first reconcile with a sentence saying what is wrong rather
/// than as a 404 from a registration-token call minutes later.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConfigUrl {
    url: Url,
    scope: Scope,
    api_base: Url,
    hosted: bool,
}

/// A configuration URL as it may be shown in an error, a status or an
/// event: without the user name and password a tenant may have pasted into
/// it (a token in `https://x:TOKEN@github.com/octo` must not reach an event),
/// whether it parses or not, and at most 256 characters.
pub fn shown(input: &str) -> String {
    let input = input.trim();
    let text = match Url::parse(input).ok().filter(Url::has_host) {
        Some(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        // Not a URL with a host: whatever stands between the scheme and
        // the last `@` may be credentials.
        None => match (input.find("://"), input.rfind('@')) {
            (Some(start), Some(at)) if at > start => {
                format!("{}://…@{}", &input[..start], &input[at + 1..])
            }
            (None, Some(at)) => format!("…@{}", &input[at + 1..]),
            _ => input.to_owned(),
        },
    };
    match text.char_indices().nth(256) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

impl ConfigUrl {
    /// Parses a configuration URL such as `https://github.com/my-org`,
    /// `https://github.com/my-org/my-repo`,
    /// `https://github.com/enterprises/my-enterprise` or the same on a GitHub
    /// Enterprise Server host.
    ///
    /// `github.com`, `www.github.com`, `github.localhost` and `*.ghe.com`
    /// (GitHub Enterprise Cloud with data residency) are hosted, and their API
    /// lives at `api.<host>`. Every other host is taken to be GitHub
    /// Enterprise Server, whose API lives under `/api/v3` on the same host and
    /// port; that includes `127.0.0.1`, which is how the tests reach the fake
    /// service.
    pub fn parse(input: &str) -> Result<Self, ActionsError> {
        let shown = shown(input);
        let invalid = |reason: &str| ActionsError::InvalidConfigUrl {
            url: shown.clone(),
            reason: reason.to_string(),
        };
        let url = Url::parse(input.trim()).map_err(|e| invalid(&e.to_string()))?;
        if url.scheme() != "https" && url.scheme() != "http" {
            return Err(invalid("the scheme must be https or http"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid("credentials belong in the secret, not in the URL"));
        }
        let host = url
            .host_str()
            .ok_or_else(|| invalid("the URL has no host"))?
            .to_ascii_lowercase();
        let segments: Vec<&str> = url
            .path()
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let scope = match segments.as_slice() {
            [org] => Scope::Organization {
                organization: (*org).to_string(),
            },
            ["enterprises", ent] => Scope::Enterprise {
                enterprise: (*ent).to_string(),
            },
            [owner, repo] => Scope::Repository {
                owner: (*owner).to_string(),
                repository: (*repo).to_string(),
            },
            [] => {
                return Err(invalid(
                    "the path must name an enterprise, an organization or a repository",
                ));
            }
            _ => {
                return Err(invalid(
                    "the path has too many segments; expected /<org>, /<owner>/<repo> or /enterprises/<enterprise>",
                ));
            }
        };

        let hosted = matches!(
            host.as_str(),
            "github.com" | "www.github.com" | "github.localhost"
        ) || host.ends_with(".ghe.com");
        let api_base = if hosted {
            let api_host = format!("api.{}", host.strip_prefix("www.").unwrap_or(&host));
            let mut api = url.clone();
            api.set_host(Some(&api_host))
                .map_err(|e| invalid(&e.to_string()))?;
            api.set_path("/");
            api
        } else {
            let mut api = url.clone();
            api.set_path("/api/v3/");
            api
        };
        let mut api_base = api_base;
        api_base.set_query(None);
        api_base.set_fragment(None);

        Ok(Self {
            url,
            scope,
            api_base,
            hosted,
        })
    }

    /// The URL as configured; it is what `runner-registration` is told.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The enterprise, organisation or repository runners register in.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether the host is GitHub's own (github.com or `*.ghe.com`) rather
    /// than a GitHub Enterprise Server.
    pub fn is_hosted(&self) -> bool {
        self.hosted
    }

    /// The GitHub REST API base, always ending in `/` so relative paths join
    /// beneath it.
    pub fn api_base(&self) -> &Url {
        &self.api_base
    }

    /// The registration-token endpoint for this scope, relative to
    /// [`ConfigUrl::api_base`].
    pub fn registration_token_path(&self) -> String {
        match &self.scope {
            Scope::Enterprise { enterprise } => {
                format!("enterprises/{enterprise}/actions/runners/registration-token")
            }
            Scope::Organization { organization } => {
                format!("orgs/{organization}/actions/runners/registration-token")
            }
            Scope::Repository { owner, repository } => {
                format!("repos/{owner}/{repository}/actions/runners/registration-token")
            }
        }
    }
}

impl fmt::Display for ConfigUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.url.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_the_credentials_pasted_into_it() {
        assert_eq!(
            shown("https://x:ghp_secret@github.com/octo"),
            "https://github.com/octo"
        );
        // Not a URL, and still nothing between the scheme and the host.
        let bad = shown("https://x:ghp_secret@git hub.com/octo");
        assert!(!bad.contains("ghp_secret"), "{bad}");
        assert_eq!(bad, "https://…@git hub.com/octo");
        assert!(!shown("x:ghp_secret@github.com").contains("ghp_secret"));
        assert_eq!(shown(&"a".repeat(1000)).chars().count(), 257);
        let err = ConfigUrl::parse("https://x:ghp_secret@github.com/octo").unwrap_err();
        assert!(!err.to_string().contains("ghp_secret"), "{err}");
    }

    fn parse(s: &str) -> ConfigUrl {
        ConfigUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn hosted_scopes_use_the_api_host() {
        let org = parse("https://github.com/my-org");
        assert_eq!(
            org.scope(),
            &Scope::Organization {
                organization: "my-org".into()
            }
        );
        assert_eq!(org.api_base().as_str(), "https://api.github.com/");
        assert!(org.is_hosted());
        assert_eq!(
            org.registration_token_path(),
            "orgs/my-org/actions/runners/registration-token"
        );

        let repo = parse("https://www.github.com/o/r/");
        assert_eq!(
            repo.scope(),
            &Scope::Repository {
                owner: "o".into(),
                repository: "r".into()
            }
        );
        assert_eq!(repo.api_base().as_str(), "https://api.github.com/");
        assert_eq!(
            repo.registration_token_path(),
            "repos/o/r/actions/runners/registration-token"
        );

        let ent = parse("https://github.com/enterprises/acme");
        assert_eq!(
            ent.scope(),
            &Scope::Enterprise {
                enterprise: "acme".into()
            }
        );
        assert_eq!(
            ent.registration_token_path(),
            "enterprises/acme/actions/runners/registration-token"
        );

        let ghec = parse("https://tenant.ghe.com/org");
        assert_eq!(ghec.api_base().as_str(), "https://api.tenant.ghe.com/");
        assert!(ghec.is_hosted());

        let local = parse("http://github.localhost/org");
        assert_eq!(local.api_base().as_str(), "http://api.github.localhost/");
    }

    #[test]
    fn other_hosts_are_enterprise_server_under_api_v3() {
        let ghes = parse("https://ghes.example.com/org/repo");
        assert!(!ghes.is_hosted());
        assert_eq!(ghes.api_base().as_str(), "https://ghes.example.com/api/v3/");

        let fake = parse("http://127.0.0.1:8123/enterprises/e");
        assert_eq!(fake.api_base().as_str(), "http://127.0.0.1:8123/api/v3/");
        assert_eq!(fake.url().as_str(), "http://127.0.0.1:8123/enterprises/e");

        // A host that merely contains github.com is not github.com.
        assert!(!parse("https://github.com.evil.example/org").is_hosted());
    }

    #[test]
    fn bad_urls_say_why() {
        for (input, needle) in [
            ("not a url", "relative URL"),
            ("ftp://github.com/org", "scheme"),
            ("https://github.com", "must name"),
            ("https://github.com/a/b/c", "too many segments"),
            ("https://user:pw@github.com/org", "credentials"),
        ] {
            let err = ConfigUrl::parse(input).expect_err(input);
            assert!(!err.to_string().contains("pw@"), "{err}");
            assert!(matches!(err, ActionsError::InvalidConfigUrl { .. }));
            assert!(err.to_string().contains(needle), "{input}: {err}");
        }
    }
}
