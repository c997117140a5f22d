//! The HTTP connections: an accept loop with a bound on open connections (one over it is
//! answered 503 and closed), hyper's header timeout (which also closes a keep-alive
//! connection left idle), a write-stall timeout (a client that stops reading loses its
//! connection, and with it its decodes), and a graceful close of every connection at
//! shutdown.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::error::ApiError;

/// The bounds on connections.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnLimits {
    /// Connections open at once at most.
    pub max_connections: usize,
    /// A request's headers must arrive within this (an idle keep-alive connection is closed
    /// after it).
    pub read_timeout: Duration,
    /// A write that makes no progress for this long closes the connection.
    pub write_timeout: Duration,
    /// How long open connections get to close at shutdown.
    pub close_timeout: Duration,
}

/// Open connections, for `/metrics` and `/stats`.
#[derive(Debug)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> usize {
        self.max - self.permits.available_permits()
    }
}

/// Serves `app` on `listener` until `stop` resolves, then closes every connection gracefully
/// (in-flight responses finish; idle ones close) within the close timeout.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    connections: Arc<Connections>,
    stop: impl std::future::Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors and the like: wait a little instead of spinning.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = Arc::clone(&connections.permits).try_acquire_owned() else {
            tokio::spawn(refuse(stream, limits.max_connections));
            continue;
        };
        let io = TokioIo::new(Guarded {
            stream,
            _permit: permit,
            write_timeout: limits.write_timeout,
            stall: None,
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        // No half_close: the end of a client's input while its request runs means the client
        // left (a socket that shut only its writing half looks the same until written to), so
        // hyper drops the request's future and the engine cancels its decode. Answering
        // half-closed clients would let every client that leaves a non-streamed request keep
        // its decode running to the end (`a_client_that_disconnects_cancels_and_frees_its_cache`).
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.read_timeout)
            .half_close(false);
        let conn = builder.serve_connection(io, TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.close_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the close timeout; dropping them");
    }
}

/// Answers a connection over the limit with a 503 naming it, then closes it.
async fn refuse(mut stream: TcpStream, max: usize) {
    let body = ApiError::bad_request(format!(
        "this server has {max} connections open, its limit; try again later"
    ))
    .with_status(axum::http::StatusCode::SERVICE_UNAVAILABLE)
    .with_code("too_many_connections")
    .body()
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent so that closing does not reset the connection before
        // it reads the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// A connection holding its slot (released when it closes) and failing a write that stalls.
struct Guarded<S> {
    stream: S,
    _permit: OwnedSemaphorePermit,
    write_timeout: Duration,
    stall: Option<Pin<Box<Sleep>>>,
}

impl<S> Guarded<S> {
    /// A write's result: `Pending` starts the stall timer (and becomes a `TimedOut` error
    /// once it has run out); progress resets it.
    fn progress<T>(&mut self, p: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if p.is_ready() {
            self.stall = None;
            return p;
        }
        let timeout = self.write_timeout;
        let timer = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", timeout.as_secs_f64()),
            ))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progress(p, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let p = Pin::new(&mut self.stream).poll_flush(cx);
        self.progress(p, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let p = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progress(p, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that never reads: once the pipe is full, the write fails after the stall
    /// timeout (not before), and the slot is free once the connection is dropped.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_write_times_out_and_frees_its_slot() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let slots = Arc::new(Semaphore::new(1));
        let permit = Arc::clone(&slots).try_acquire_owned().unwrap();
        let mut conn = Guarded {
            stream: ours,
            _permit: permit,
            write_timeout: Duration::from_secs(5),
            stall: None,
        };
        assert_eq!(slots.available_permits(), 0);
        let start = tokio::time::Instant::now();
        let mut written = 0;
        let err = loop {
            match conn.write(&[7u8; 16]).await {
                Ok(n) => written += n,
                Err(e) => break e,
            }
        };
        assert_eq!(written, 64);
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        drop(conn);
        assert_eq!(slots.available_permits(), 1);
    }

    /// Progress resets the timer: a slow reader that keeps reading is not cut off.
    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_is_not_cut_off() {
        let (ours, mut theirs) = tokio::io::duplex(16);
        let slots = Arc::new(Semaphore::new(1));
        let mut conn = Guarded {
            stream: ours,
            _permit: Arc::clone(&slots).try_acquire_owned().unwrap(),
            write_timeout: Duration::from_secs(5),
            stall: None,
        };
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            let mut got = 0;
            while got < 256 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                got += theirs.read(&mut buf).await.unwrap();
            }
            got
        });
        conn.write_all(&[1u8; 256]).await.unwrap();
        drop(conn);
        assert!(reader.await.unwrap() >= 256);
    }
}
