//! systemd's readiness protocol (`Type=notify`): one datagram with
//! `READY=1` (or `STOPPING=1`) to the unix socket named by `NOTIFY_SOCKET`,
//! when systemd set it; nothing otherwise. A leading `@` names an abstract
//! socket.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `"READY=1"`) to systemd; `Ok(false)` when not
/// started by systemd with `NOTIFY_SOCKET`.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return Ok(false) };
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    /// Goal: the datagram reaches the socket NOTIFY_SOCKET names. Method: a
    /// socket of our own in a temporary directory. (The only test touching
    /// the variable, so setting it cannot race another test.)
    #[test]
    fn ready_reaches_the_notify_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let listener = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
        // SAFETY-free: std marks set_var unsafe only in edition 2024.
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(super::notify("READY=1").expect("sent"));
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");
        assert!(!super::notify("READY=1").expect("no socket: nothing sent"));
    }
}
