//! An IO that first gives back bytes already read from it: how a connection the
//! own loop has started reading is handed to hyper without losing a byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Rewind<S> {
    read_ahead: Vec<u8>,
    /// How much of `read_ahead` was given back already.
    given: usize,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(read_ahead: Vec<u8>, inner: S) -> Rewind<S> {
        Rewind {
            read_ahead,
            given: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.given < this.read_ahead.len() {
            let rest = &this.read_ahead[this.given..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.given += n;
            if this.given == this.read_ahead.len() {
                this.read_ahead = Vec::new();
                this.given = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn read_ahead_bytes_come_first_then_the_stream() {
        let (mut client, server) = tokio::io::duplex(64);
        let mut io = Rewind::new(b"GET / HT".to_vec(), server);
        client.write_all(b"TP/1.1\r\n\r\n").await.unwrap();
        drop(client);
        let mut all = Vec::new();
        // Small reads: the read-ahead is given back across several of them.
        let mut chunk = [0u8; 3];
        loop {
            let n = io.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            all.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(all, b"GET / HTTP/1.1\r\n\r\n");
    }
}
