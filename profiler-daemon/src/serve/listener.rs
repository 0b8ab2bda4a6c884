//! Where the daemon listens: TCP (loopback by default; the caller's user
//! comes from socket diagnostics) or a Unix socket (`unix:/path`; the
//! caller's user comes from SO_PEERCRED).

use std::{
    fmt, io,
    net::SocketAddr,
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    str::FromStr,
};

use tokio::net::{TcpListener, TcpSocket, TcpStream, UnixListener, UnixStream};

/// Connections the kernel completes before we accept them. std's and
/// tokio's 128 fills in a burst of connects, and then every new client's
/// SYN is dropped and retried a second later: a flood of connections would
/// add a second to each scrape. The kernel caps it at net.core.somaxconn.
const LISTEN_BACKLOG: u32 = 4096;

/// The `listen` setting: `IP:PORT` or `unix:/absolute/path`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum ListenAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for ListenAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            let path = Path::new(path);
            if !path.is_absolute() {
                return Err(format!(
                    "{text}: a Unix socket needs an absolute path (unix:/run/profilerd/profilerd.sock)"
                ));
            }
            return Ok(Self::Unix(path.to_owned()));
        }
        text.parse()
            .map(Self::Tcp)
            .map_err(|_| format!("{text}: expected IP:PORT (127.0.0.1:7040) or unix:/absolute/path"))
    }
}

impl TryFrom<String> for ListenAddress {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(address) => address.fmt(f),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A bound listener. A Unix socket's file goes when the listener does.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

/// What one accept brought.
pub(super) enum Accepted {
    Tcp(TcpStream, SocketAddr),
    Unix(UnixStream),
}

impl Listener {
    pub(super) async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Self::Tcp(listener) => {
                let (stream, client) = listener.accept().await?;
                Ok(Accepted::Tcp(stream, client))
            }
            Self::Unix(listener, _) => {
                let (stream, _) = listener.accept().await?;
                Ok(Accepted::Unix(stream))
            }
        }
    }

    /// Where a client reaches it, for the log: the port a `:0` got included.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(listener) => match listener.local_addr() {
                Ok(address) => format!("http://{address}/pprof?seconds=10"),
                Err(_) => "a TCP socket".to_owned(),
            },
            Self::Unix(_, file) => format!(
                "curl --unix-socket {} 'http://localhost/pprof?seconds=10'",
                file.path.display()
            ),
        }
    }
}

/// Binds `address`. TCP as `TcpListener::bind` does (SO_REUSEADDR), with a
/// deeper accept queue. A Unix socket replaces a stale socket file (one no
/// daemon answers on), never another kind of file, and is open to every
/// local user (mode 0666): what each one may see is decided per connection.
pub fn bind(address: &ListenAddress) -> io::Result<Listener> {
    match address {
        ListenAddress::Tcp(address) => {
            let socket = if address.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            socket.bind(*address)?;
            Ok(Listener::Tcp(socket.listen(LISTEN_BACKLOG)?))
        }
        ListenAddress::Unix(path) => {
            remove_stale_socket(path)?;
            let listener = UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
            let metadata = std::fs::symlink_metadata(path)?;
            Ok(Listener::Unix(
                listener,
                SocketFile {
                    path: path.clone(),
                    identity: (metadata.dev(), metadata.ino()),
                },
            ))
        }
    }
}

fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process answers on {}", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// The socket file of a Unix listener, removed with it unless something
/// else has replaced it meanwhile.
pub struct SocketFile {
    path: PathBuf,
    identity: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_back() {
        for text in [
            "127.0.0.1:7040",
            "[::1]:7040",
            "unix:/run/profilerd/profilerd.sock",
        ] {
            let address: ListenAddress = text.parse().expect(text);
            assert_eq!(address.to_string(), text);
        }
        assert!("unix:relative.sock".parse::<ListenAddress>().is_err());
        assert!("localhost:7040".parse::<ListenAddress>().is_err());
        assert!("unix:".parse::<ListenAddress>().is_err());
    }
}
