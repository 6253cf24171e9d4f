//! Which hosts the client may call: an operator's allow-list of Actions
//! hosts.
//!
//! A scale set's `githubConfigUrl` is a tenant's to write, and the client
//! follows it, and then the service URLs the server at that address answers
//! with, from the controller's own place in the network: inside the
//! cluster, next to its services, its nodes' link-local metadata endpoint
//! and whatever the cluster can reach. Without a bound, a tenant could aim
//! the controller's requests at any of those and read pieces of the answers
//! back in its scale set's status (server-side request forgery).
//!
//! So the configuration URL's host must match the operator's list
//! (`--actions-hosts`: `github.com` and `*.ghe.com` unless told, plus the
//! GitHub Enterprise Server hosts an operator allows), and every URL the
//! service hands back must be one the Actions service itself uses: the
//! configuration host or one of its subdomains (the API host, a GHES's own
//! services), `*.actions.githubusercontent.com` (github.com's pipelines and
//! broker), or a host the list names. A pattern `*.suffix` never matches an
//! address: an IP address is allowed only by being listed as it is, so
//! loopback, link-local (`169.254.169.254`) and the cluster's service
//! addresses are refused unless the operator names them. `*` alone allows
//! every host (tests against a local fake, and operators who want no list).

use url::{Host, Url};

/// The hosts a client may call; [`HostPolicy::Any`] by default, which a
/// library user (tests, the CLI) gets; `arcwright run` always sets a list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HostPolicy {
    /// Every host.
    #[default]
    Any,
    /// The configuration host must match one of these; service hosts may
    /// match them too.
    Listed(Vec<HostPattern>),
}

/// One entry of the list: a host name or address as it is, or
/// `*.suffix`, any subdomain of `suffix` (not `suffix` itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostPattern {
    /// The host exactly (names compared in lower case).
    Exact(String),
    /// Any name ending in `.suffix`.
    Subdomains(String),
}

/// The hosts of github.com's Actions service that a configuration URL on
/// github.com hands out (pipelines, broker and their regional instances).
const ACTIONS_SERVICE_SUFFIX: &str = "actions.githubusercontent.com";

impl HostPattern {
    /// The entry `text`: `*.suffix`, or a host name or address.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        if let Some(suffix) = text.strip_prefix("*.") {
            if suffix.is_empty() || suffix.contains('*') || Host::parse(suffix).is_err() {
                return Err(format!("{text:?} is not *.DOMAIN"));
            }
            return Ok(Self::Subdomains(suffix.to_owned()));
        }
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(&text);
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            return Ok(Self::Exact(ip.to_string()));
        }
        if bare.is_empty() || bare.contains(['*', '/', ':']) {
            return Err(format!(
                "{text:?} is not a host name, an address or *.DOMAIN"
            ));
        }
        let host = Host::parse(bare)
            .map_err(|error| format!("{text:?} is not a host: {error}"))?
            .to_string();
        Ok(Self::Exact(host))
    }

    fn matches(&self, host: &Host<&str>) -> bool {
        match (self, host) {
            (Self::Exact(exact), host) => *exact == host_text(host),
            (Self::Subdomains(suffix), Host::Domain(name)) => is_subdomain(name, suffix),
            (Self::Subdomains(_), _) => false,
        }
    }
}

impl HostPolicy {
    /// The policy of `--actions-hosts`: `*` alone is [`HostPolicy::Any`].
    pub fn from_entries<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        if entries.iter().any(|entry| entry.as_ref().trim() == "*") {
            return Ok(Self::Any);
        }
        entries
            .iter()
            .map(|entry| HostPattern::parse(entry.as_ref()))
            .collect::<Result<Vec<_>, _>>()
            .map(Self::Listed)
    }

    /// Whether a client may be built for the configuration URL `config`;
    /// the reason when not.
    pub fn check_config(&self, config: &Url) -> Result<(), String> {
        let Self::Listed(patterns) = self else {
            return Ok(());
        };
        let host = config.host().ok_or("the URL has no host")?;
        if patterns.iter().any(|pattern| pattern.matches(&host)) {
            return Ok(());
        }
        Err(format!(
            "{} is not an Actions host this controller may call (the operator's --actions-hosts \
             lists them: github.com and *.ghe.com unless told, plus the GitHub Enterprise Server \
             hosts allowed)",
            host_text(&host)
        ))
    }

    /// Whether a call to `url`, which the service behind `config` handed
    /// out (or `config` itself), may be made.
    pub fn allows_call(&self, config: &Url, url: &Url) -> bool {
        let Self::Listed(patterns) = self else {
            return true;
        };
        let Some(host) = url.host() else {
            return false;
        };
        if patterns.iter().any(|pattern| pattern.matches(&host)) {
            return true;
        }
        let Host::Domain(name) = host else {
            // An address only by being listed (above), or being the
            // configuration's own, listed address.
            return config
                .host()
                .is_some_and(|c| host_text(&c) == host_text(&host));
        };
        let name = name.to_ascii_lowercase();
        match config.host() {
            Some(Host::Domain(config_host)) => {
                let config_host = config_host.to_ascii_lowercase();
                name == config_host
                    || is_subdomain(&name, &config_host)
                    || (is_github_com(&config_host) && is_subdomain(&name, ACTIONS_SERVICE_SUFFIX))
            }
            _ => false,
        }
    }
}

fn is_github_com(host: &str) -> bool {
    host == "github.com" || host == "www.github.com"
}

/// Whether `name` is a subdomain of `suffix` (both lower case but `name`).
fn is_subdomain(name: &str, suffix: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// A host as the list writes it: names in lower case, addresses bare.
fn host_text(host: &Host<&str>) -> String {
    match host {
        Host::Domain(name) => name.to_ascii_lowercase(),
        Host::Ipv4(ip) => ip.to_string(),
        Host::Ipv6(ip) => ip.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        text.parse().unwrap()
    }

    fn default_list() -> HostPolicy {
        HostPolicy::from_entries(&["github.com", "*.ghe.com"]).unwrap()
    }

    #[test]
    fn configuration_hosts_must_be_listed_and_addresses_only_as_they_are() {
        let list = default_list();
        for allowed in [
            "https://github.com/octo",
            "https://GitHub.com/octo/hello",
            "https://octo.ghe.com/enterprises/e",
        ] {
            list.check_config(&url(allowed)).unwrap();
        }
        for refused in [
            "https://ghe.com/octo",
            "https://evilghe.com/octo",
            "https://github.com.evil.example/octo",
            "https://169.254.169.254/latest/meta-data",
            "https://127.0.0.1:6443/api",
            "https://kubernetes.default.svc/api",
            "https://10.96.0.1/octo",
        ] {
            let error = list.check_config(&url(refused)).unwrap_err();
            assert!(error.contains("--actions-hosts"), "{refused}: {error}");
        }
        // An operator's GHES, by name or by address.
        let ghes =
            HostPolicy::from_entries(&["github.com", "ghes.corp.example", "10.0.0.5"]).unwrap();
        ghes.check_config(&url("https://ghes.corp.example/octo"))
            .unwrap();
        ghes.check_config(&url("https://10.0.0.5/octo")).unwrap();
        assert!(ghes.check_config(&url("https://10.0.0.6/octo")).is_err());
        // `*` is no list at all.
        let any = HostPolicy::from_entries(&["*"]).unwrap();
        assert_eq!(any, HostPolicy::Any);
        any.check_config(&url("http://127.0.0.1:9/octo")).unwrap();
    }

    #[test]
    fn service_urls_are_the_actions_services_own_hosts() {
        let list = default_list();
        let github = url("https://github.com/octo");
        for allowed in [
            "https://api.github.com/actions/runner-registration",
            "https://pipelinesghubeus2.actions.githubusercontent.com/abc/",
            "https://broker.actions.githubusercontent.com/message",
        ] {
            assert!(list.allows_call(&github, &url(allowed)), "{allowed}");
        }
        for refused in [
            "https://169.254.169.254/latest/meta-data",
            "https://metadata.google.internal/",
            "https://actions.githubusercontent.com.evil.example/",
            "https://10.96.0.1/",
        ] {
            assert!(!list.allows_call(&github, &url(refused)), "{refused}");
        }
        // A GHES serves its own pipelines under its host.
        let ghes = HostPolicy::from_entries(&["ghes.corp.example"]).unwrap();
        let config = url("https://ghes.corp.example/octo");
        assert!(ghes.allows_call(
            &config,
            &url("https://ghes.corp.example/_services/pipelines/")
        ));
        assert!(ghes.allows_call(&config, &url("https://api.ghes.corp.example/")));
        assert!(!ghes.allows_call(
            &config,
            &url("https://pipelines.actions.githubusercontent.com/")
        ));
        // A listed address's own service URLs are that address.
        let fake = HostPolicy::from_entries(&["127.0.0.1"]).unwrap();
        let config = url("http://127.0.0.1:8080/octo");
        assert!(fake.allows_call(&config, &url("http://127.0.0.1:8080/_services/pipelines")));
        assert!(!fake.allows_call(&config, &url("http://127.0.0.2:8080/")));
    }

    #[test]
    fn entries_that_are_not_hosts_are_refused() {
        for refused in [
            "",
            "*",
            "*.",
            "a*.b",
            "https://github.com",
            "github.com/x",
            "**.x",
        ] {
            assert!(HostPattern::parse(refused).is_err(), "{refused:?}");
        }
        assert_eq!(
            HostPattern::parse("[::1]").unwrap(),
            HostPattern::Exact("::1".into())
        );
        assert_eq!(
            HostPattern::parse("*.GHE.com").unwrap(),
            HostPattern::Subdomains("ghe.com".into())
        );
    }
}
