//! Which uid owns the client end of a TCP connection on this machine, asked
//! of the kernel with socket diagnostics (what `ss -e` shows as `uid:`).

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    AF_INET, AF_INET6, IPPROTO_TCP, SockDiagMessage,
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr as NetlinkAddr, protocols::NETLINK_SOCK_DIAG};

/// Tells the kernel not to check the socket cookie (we have none).
const NO_COOKIE: [u8; 8] = [0xff; 8];
/// Answers to one exact lookup: one socket's header and a few attributes.
const RECEIVE_BYTES: usize = 8192;

#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("socket diagnostics")]
    Netlink(#[from] std::io::Error),
    #[error("socket diagnostics: undecodable answer: {0}")]
    Decode(String),
    #[error("no socket on this machine holds the other end of the connection (errno {0})")]
    NotFound(i32),
    #[error("the other end of the connection is a closing or half-open socket, which has no owner")]
    NoOwner,
    #[error("socket diagnostics gave no answer")]
    NoAnswer,
}

/// The uid that owns the socket at `client` connected to our `server`
/// address. Only a full socket counts: the kernel reports uid 0 for the
/// mini-sockets of closing (TIME_WAIT, orphaned FIN_WAIT2) and half-open
/// connections, which must not pass for root.
pub fn peer_uid(client: SocketAddr, server: SocketAddr) -> Result<u32, PeerError> {
    let (client, server) = (unmapped(client), unmapped(server));
    let family = if client.is_ipv4() { AF_INET } else { AF_INET6 };
    // The lookup finds the socket whose own address is `source`.
    let socket_id = SocketId {
        source_port: client.port(),
        destination_port: server.port(),
        source_address: client.ip(),
        destination_address: server.ip(),
        interface_id: 0,
        cookie: NO_COOKIE,
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut message = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id,
        })
        .into(),
    );
    message.finalize();
    let mut request = vec![0; message.buffer_len()];
    message.serialize(&mut request);

    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&NetlinkAddr::new(0, 0))?;
    socket.send(&request, 0)?;
    // The kernel answers an exact lookup within the send: the receive does
    // not wait on anyone.
    let mut answer = vec![0; RECEIVE_BYTES];
    let received = socket.recv(&mut &mut answer[..], 0)?;
    let answer = answer.get(..received).ok_or(PeerError::NoAnswer)?;
    let reply = NetlinkMessage::<SockDiagMessage>::deserialize(answer)
        .map_err(|err| PeerError::Decode(err.to_string()))?;
    match reply.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
            // Mini-sockets have no inode: they belong to no process.
            if response.header.inode == 0 {
                return Err(PeerError::NoOwner);
            }
            Ok(response.header.uid)
        }
        NetlinkPayload::Error(error) => Err(PeerError::NotFound(error.code.map_or(0, |code| code.get()))),
        _ => Err(PeerError::NoAnswer),
    }
}

/// An IPv4 peer of a dual-stack IPv6 listener is an IPv4 socket.
fn unmapped(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), address.port()),
            None => address,
        },
        IpAddr::V4(_) => address,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn finds_the_owner_of_a_loopback_client() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding loopback");
        let server = listener.local_addr().expect("listener address");
        let _client = TcpStream::connect(server).expect("connecting");
        let (_accepted, client) = listener.accept().expect("accepting");
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(peer_uid(client, server).expect("the client's uid"), me);
    }

    #[test]
    fn a_connection_that_does_not_exist_is_not_found() {
        let server: SocketAddr = "127.0.0.1:9".parse().expect("address");
        let client: SocketAddr = "127.0.0.1:1".parse().expect("address");
        assert!(
            matches!(peer_uid(client, server), Err(PeerError::NotFound(_))),
            "no such socket"
        );
    }
}
