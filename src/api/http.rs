//! Serving the router over HTTP/1.1 with hyper: the connection-level protections a public server
//! needs (a deadline for request headers, an idle limit on request bodies) and graceful shutdown
//! (stop accepting, let in-flight requests finish for a bounded time, then cut the rest).
//!
//! The body idle limit applies to the request body only, so long-lived responses (watch streams,
//! streamed exec output) are never cut by it. Connections may be upgraded (WebSockets). This
//! module routes nothing and knows no handler.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tower::Service;

/// Timeouts of [`serve_with`].
#[derive(Clone, Copy, Debug)]
pub struct ServeOptions {
    /// A client must send all request headers within this time (also bounds idle keep-alive).
    pub header_read_timeout: Duration,
    /// A request body that sends nothing for this long while the server waits for it fails.
    pub body_idle_timeout: Duration,
    /// After shutdown is asked for, in-flight requests get this long to finish.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_read_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then drains as described in the
/// module documentation. Returns when every connection is closed.
pub async fn serve(listener: TcpListener, router: Router, shutdown: impl Future<Output = ()>) {
    serve_with(listener, router, shutdown, ServeOptions::default()).await
}

/// [`serve`] with explicit timeouts.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, remote) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let idle = options.body_idle_timeout;
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let mut router = router.clone();
            let mut request = request.map(|body| Body::new(IdleTimeoutBody::new(body, idle)));
            request.extensions_mut().insert(ConnectInfo(remote));
            async move { Ok::<_, Infallible>(router.call(request).await.unwrap_or_else(|e| match e {})) }
        });
        // With upgrades: the WebSocket routes (process attach and exec) take the connection over.
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop_rx.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => log_connection_end(remote, result),
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    log_connection_end(remote, connection.await);
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(options.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "requests still running after the shutdown grace period; closing their connections"
        );
        connections.shutdown().await;
    }
}

fn log_connection_end(remote: SocketAddr, result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        // Timeouts and clients that vanish are routine; nothing to act on.
        tracing::debug!(%remote, error = %e, "connection ended with an error");
    }
}

/// The client sent no body data for too long while the server was waiting for it.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled for more than {0:?}")]
pub struct BodyIdleTimeout(Duration);

pin_project_lite::pin_project! {
    /// Fails a request body that stays silent for `idle` while someone is reading it. The clock
    /// runs only while the server waits, so slow handlers never trip it.
    struct IdleTimeoutBody<B> {
        #[pin]
        inner: B,
        sleep: Pin<Box<Sleep>>,
        idle: Duration,
        waiting: bool,
    }
}

impl<B> IdleTimeoutBody<B> {
    fn new(inner: B, idle: Duration) -> Self {
        IdleTimeoutBody {
            inner,
            sleep: Box::pin(tokio::time::sleep(idle)),
            idle,
            waiting: false,
        }
    }
}

impl<B> hyper::body::Body for IdleTimeoutBody<B>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if !*this.waiting {
            this.sleep.as_mut().reset(Instant::now() + *this.idle);
            *this.waiting = true;
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                *this.waiting = false;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyIdleTimeout(*this.idle))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(
        options: ServeOptions,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ) {
        let router = Router::new()
            .route("/", get(|| async { "hi" }))
            .route(
                "/echo",
                post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
            )
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve_with(
            listener,
            router,
            async {
                let _ = rx.await;
            },
            options,
        ));
        (addr, tx, task)
    }

    async fn read_all(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    fn quick() -> ServeOptions {
        ServeOptions {
            header_read_timeout: Duration::from_millis(300),
            body_idle_timeout: Duration::from_millis(300),
            shutdown_grace: Duration::from_secs(2),
        }
    }

    #[tokio::test]
    async fn serves_and_cuts_off_trickled_headers() {
        let (addr, _stop, _task) = start(quick()).await;
        let mut ok = TcpStream::connect(addr).await.unwrap();
        ok.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(read_all(&mut ok).await.ends_with("hi"));

        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        let started = std::time::Instant::now();
        let answer = read_all(&mut slow).await;
        assert!(!answer.contains("hi"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_stalled_body_fails_the_request() {
        let (addr, _stop, _task) = start(quick()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let answer = read_all(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn shutdown_lets_in_flight_requests_finish_and_stops_accepting() {
        let (addr, stop, task) = start(quick()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send(()).unwrap();
        let answer = read_all(&mut s).await;
        assert!(answer.ends_with("done"), "{answer}");
        tokio::time::timeout(Duration::from_secs(3), task)
            .await
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
