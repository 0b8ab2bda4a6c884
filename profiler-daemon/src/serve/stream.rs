//! A connection's socket (TCP, Unix, or TLS over TCP), watched for the
//! connection's bounds.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpStream, UnixStream},
};
use tokio_rustls::server::TlsStream;

use super::connections::Slot;

/// The socket, telling the connection's [`Slot`] when bytes arrive and
/// whether a response write is stuck on the client. Over TLS it sees the
/// plaintext: bytes of requests and answers, as on a plain connection.
pub(super) struct Watched {
    pub(super) stream: Stream,
    pub(super) slot: Arc<Slot>,
}

/// A connection's socket.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// Boxed: rustls's state is ~1 KiB, and most connections are plain.
    Tls(Box<TlsStream<TcpStream>>),
}

/// `$body` with `$stream` bound to whichever socket `$self` holds.
macro_rules! each {
    ($self:expr, $stream:ident => $body:expr) => {
        match $self {
            Stream::Tcp($stream) => $body,
            Stream::Unix($stream) => $body,
            Stream::Tls($stream) => $body,
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), stream => Pin::new(stream).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), stream => Pin::new(stream).poll_write(cx, data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), stream => Pin::new(stream).poll_write_vectored(cx, data))
    }

    fn is_write_vectored(&self) -> bool {
        each!(self, stream => stream.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), stream => Pin::new(stream).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), stream => Pin::new(stream).poll_shutdown(cx))
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.on_read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        self.note_write(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, data);
        self.note_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        // hyper flushes once its buffer is written out: nothing is pending.
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.slot.set_write_blocked(false);
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Watched {
    fn note_write<T>(&self, polled: &Poll<io::Result<T>>) {
        if polled.is_pending() {
            self.slot.set_write_blocked(true);
        }
    }
}
