//! The serving side: a rustls config whose certificate resolver follows its files, and the
//! connection stream every service hands to tonic.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use futures::Stream;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::either::Either;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::{ServerTlsConfig, TlsError, load_certified_key, load_roots, provider};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often, at most, the certificate files are looked at.
const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// Handshaken connections waiting for tonic to take them.
const ACCEPTED_QUEUE: usize = 64;

/// The connections of a listener, for `serve_with_incoming_shutdown`.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<Conn>> + Send>>;

/// Returns the connections of `listener`: TCP streams as they are when `tls` is off, TLS
/// streams once their handshake succeeded when on. A failed or slow handshake is logged and
/// dropped; the listener keeps accepting. The listener is closed when tonic drops the stream.
pub fn incoming(listener: TcpListener, tls: &ServerTlsConfig) -> Result<Incoming, TlsError> {
    incoming_speaking(listener, tls, b"h2")
}

/// [`incoming`] for a server whose clients negotiate `protocol` (ALPN) when they negotiate one.
fn incoming_speaking(listener: TcpListener, tls: &ServerTlsConfig, protocol: &[u8]) -> Result<Incoming, TlsError> {
    let Some(acceptor) = acceptor(tls, protocol)? else {
        return Ok(Box::pin(
            TcpListenerStream::new(listener).map(|stream| stream.map(|s| Conn(Either::Left(no_delay(s))))),
        ));
    };
    let (accepted_tx, accepted_rx) = tokio::sync::mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = accepted_tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %error, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let acceptor = acceptor.clone();
            let accepted_tx = accepted_tx.clone();
            let stream = no_delay(stream);
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = accepted_tx.send(Ok(Conn(Either::Right(Box::new(tls))))).await;
                    }
                    Ok(Err(error)) => tracing::info!(%peer, error = %error, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Ok(Box::pin(ReceiverStream::new(accepted_rx)))
}

/// Turns Nagle's algorithm off on an accepted connection (tonic does it only on the listeners
/// it makes itself): with it on, the last small segment of an answer waits for the client's
/// delayed ACK, up to 40 ms, and a call made shortly after another often paid that in full
/// (measured: LatestMetrics 3 ms when calls were 100 ms apart, 45 ms when 20 ms apart).
fn no_delay(stream: TcpStream) -> TcpStream {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(error = %error, "cannot set TCP_NODELAY on a connection");
    }
    stream
}

/// An HTTP/1.1 server's listener for `axum::serve`: the connections of [`incoming`], with
/// `http/1.1` as the protocol clients negotiate.
pub struct HttpListener {
    incoming: Incoming,
    local: SocketAddr,
}

/// The [`HttpListener`] of `listener`: TLS when `tls` names a certificate, plain TCP when not.
pub fn http_listener(listener: TcpListener, tls: &ServerTlsConfig) -> Result<HttpListener, TlsError> {
    let local = listener
        .local_addr()
        .map_err(|error| TlsError::Invalid(format!("the listener has no address: {error}")))?;
    Ok(HttpListener {
        incoming: incoming_speaking(listener, tls, b"http/1.1")?,
        local,
    })
}

impl axum::serve::Listener for HttpListener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => {
                    let peer = conn.connect_info().remote_addr().unwrap_or(self.local);
                    return (conn, peer);
                }
                Some(Err(error)) => {
                    tracing::warn!(error = %error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // The accepting task ended: nothing will come.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The TLS acceptor of `tls` whose clients negotiate `protocol`, `None` when TLS is off.
fn acceptor(tls: &ServerTlsConfig, protocol: &[u8]) -> Result<Option<TlsAcceptor>, TlsError> {
    let (Some(cert_file), Some(key_file)) = (&tls.cert_file, &tls.key_file) else {
        if tls.cert_file.is_some() || tls.key_file.is_some() {
            return Err(TlsError::Invalid("cert-file and key-file go together".into()));
        }
        return Ok(None);
    };
    let resolver = ReloadingResolver::new(cert_file.clone(), key_file.clone())?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(e.to_string()))?;
    let builder = match &tls.client_ca_file {
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(path)?), provider());
            let verifier = if tls.require_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|e| TlsError::ClientCa {
                path: path.clone(),
                message: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None if tls.require_client_cert => {
            return Err(TlsError::Invalid("require-client-cert needs client-ca-file".into()));
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![protocol.to_vec()];
    Ok(Some(TlsAcceptor::from(Arc::new(config))))
}

/// What identifies a version of the files: their modification times and lengths.
type Stamp = [(Option<SystemTime>, u64); 2];

/// Serves the pair of `cert_file` and `key_file`, reading them again when they change.
#[derive(Debug)]
struct ReloadingResolver {
    cert_file: PathBuf,
    key_file: PathBuf,
    state: Mutex<ResolverState>,
}

#[derive(Debug)]
struct ResolverState {
    current: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

impl ReloadingResolver {
    fn new(cert_file: PathBuf, key_file: PathBuf) -> Result<ReloadingResolver, TlsError> {
        let stamp = stamp(&cert_file, &key_file);
        let current = Arc::new(load_certified_key(&cert_file, &key_file)?);
        Ok(ReloadingResolver {
            cert_file,
            key_file,
            state: Mutex::new(ResolverState {
                current,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// Returns the pair to serve, first reading the files again when they changed.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().expect("resolver lock");
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let stamp = stamp(&self.cert_file, &self.key_file);
            if stamp != state.stamp {
                // Marked seen either way: a broken pair is reported once, not per connection.
                state.stamp = stamp;
                match load_certified_key(&self.cert_file, &self.key_file) {
                    Ok(pair) => {
                        state.current = Arc::new(pair);
                        tracing::info!(cert = %self.cert_file.display(), "TLS certificate reloaded");
                    }
                    Err(error) => tracing::warn!(
                        error = %error,
                        "cannot reload the TLS certificate; serving the previous one"
                    ),
                }
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(cert_file: &PathBuf, key_file: &PathBuf) -> Stamp {
    [cert_file, key_file].map(|path| match std::fs::metadata(path) {
        Ok(meta) => (meta.modified().ok(), meta.len()),
        Err(_) => (None, 0),
    })
}

/// One accepted connection, plain or TLS.
pub struct Conn(Either<TcpStream, Box<TlsStream<TcpStream>>>);

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match &self.0 {
            Either::Left(tcp) => tcp.connect_info(),
            Either::Right(tls) => tls.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
