//! The HTTP endpoints for the kubelet and Prometheus: `/healthz`,
//! `/readyz` and `/metrics`.
//!
//! `/healthz` says only that the process is alive and serving: it stays 200
//! through start-up and shutdown, because a liveness probe that failed while
//! caches sync or listeners drain would have the kubelet kill a process that
//! is doing exactly what it should. `/readyz` is the one that waits
//! ([`super::readiness`]). Neither probe touches the API server: a probe
//! that did would turn an apiserver hiccup into restarts of every replica.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::metrics::{CONTENT_TYPE, MetricsRegistry};
use super::readiness::{Readiness, Verdict};

#[derive(Clone)]
struct Endpoints {
    metrics: MetricsRegistry,
    readiness: Readiness,
}

/// The router serving the three endpoints.
pub fn router(metrics: MetricsRegistry, readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(Endpoints { metrics, readiness })
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(endpoints): State<Endpoints>) -> (StatusCode, String) {
    match endpoints.readiness.verdict() {
        Verdict::Ready => (StatusCode::OK, "ok\n".into()),
        Verdict::Waiting(names) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("waiting for: {}\n", names.join(", ")),
        ),
        Verdict::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n".into()),
    }
}

async fn scrape(State(endpoints): State<Endpoints>) -> Response {
    match endpoints.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the metrics could not be encoded\n",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves the router on a free loopback port; the task ends with the test.
    async fn serve(metrics: MetricsRegistry, readiness: Readiness) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(axum::serve(listener, router(metrics, readiness)).into_future());
        format!("http://{address}")
    }

    async fn get(url: &str) -> (u16, String) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let response = reqwest::get(url).await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    #[tokio::test]
    async fn readyz_is_503_until_every_component_is_ready() {
        let readiness = Readiness::default();
        let synced = readiness.gate("synced");
        let slow = readiness.gate("slow-cache");
        synced.ready();
        let base = serve(MetricsRegistry::new(), readiness.clone()).await;

        assert_eq!(
            get(&format!("{base}/readyz")).await,
            (503, "waiting for: slow-cache\n".into())
        );
        assert_eq!(get(&format!("{base}/healthz")).await.0, 200);

        slow.ready();
        assert_eq!(get(&format!("{base}/readyz")).await, (200, "ok\n".into()));

        readiness.shutting_down();
        assert_eq!(
            get(&format!("{base}/readyz")).await,
            (503, "shutting down\n".into())
        );
        assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    }

    #[tokio::test]
    async fn metrics_registered_after_start_are_scraped() {
        let metrics = MetricsRegistry::new();
        let base = serve(metrics.clone(), Readiness::default()).await;
        let counter = metrics.register(|registry| {
            let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
            registry.register(
                "late",
                "Registered after the server started",
                counter.clone(),
            );
            counter
        });
        counter.inc();

        let _ = rustls::crypto::ring::default_provider().install_default();
        let response = reqwest::get(format!("{base}/metrics")).await.unwrap();
        assert_eq!(
            response.headers()[reqwest::header::CONTENT_TYPE],
            CONTENT_TYPE
        );
        let text = response.text().await.unwrap();
        assert!(text.contains("\nlate_total 1\n"), "{text}");
        assert!(
            text.contains(&format!(
                "arcwright_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
