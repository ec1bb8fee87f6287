//! A peer "outside" that a test owns: a network namespace holding one address on a veth pair,
//! routed from the host to that pair alone, with a listener that answers one line. It stands in
//! for a destination beyond the host (a link-local metadata address, an address on the way out)
//! without sending anything to any address the test does not own. Gone with its value.

use std::process::{Child, Command};

/// Runs a command of the host; whether it succeeded, and what it printed.
pub fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn must(args: &[&str]) {
    let (ok, out) = run(args);
    assert!(ok, "{args:?}: {out}");
}

pub struct RoutedPeer {
    ns: String,
    host_side: String,
    listener: Option<Child>,
}

impl RoutedPeer {
    /// `address` (IPv4) answers `reply` on TCP `port`; the host's end of the pair gets
    /// `host_address`, since Docker masquerades what leaves a bridge and needs an address there.
    pub fn start(address: &str, host_address: &str, port: u16, reply: &str) -> RoutedPeer {
        let tag = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let (ns, host_side, ns_side) = (
            format!("asb-peer-{tag}"),
            format!("asbh{tag}"),
            format!("asbn{tag}"),
        );
        must(&["ip", "netns", "add", &ns]);
        let mut peer = RoutedPeer {
            ns: ns.clone(),
            host_side: host_side.clone(),
            listener: None,
        };
        must(&[
            "ip", "link", "add", &host_side, "type", "veth", "peer", "name", &ns_side,
        ]);
        must(&["ip", "link", "set", &ns_side, "netns", &ns]);
        must(&[
            "ip",
            "addr",
            "add",
            &format!("{host_address}/32"),
            "dev",
            &host_side,
        ]);
        must(&["ip", "link", "set", &host_side, "up"]);
        let in_ns = |args: &[&str]| {
            let mut all = vec!["ip", "netns", "exec", &ns];
            all.extend_from_slice(args);
            must(&all);
        };
        in_ns(&["ip", "link", "set", "lo", "up"]);
        in_ns(&[
            "ip",
            "addr",
            "add",
            &format!("{address}/32"),
            "dev",
            &ns_side,
        ]);
        in_ns(&["ip", "link", "set", &ns_side, "up"]);
        in_ns(&["ip", "route", "add", "default", "dev", &ns_side]);
        must(&[
            "ip",
            "route",
            "add",
            &format!("{address}/32"),
            "dev",
            &host_side,
        ]);
        let script = format!(
            "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('{address}', {port}))\ns.listen(16)\nwhile True:\n    c, _ = s.accept()\n    \
             c.sendall(b'{reply}\\n')\n    c.close()\n"
        );
        peer.listener = Some(
            Command::new("ip")
                .args(["netns", "exec", &ns, "python3", "-c", &script])
                .spawn()
                .unwrap(),
        );
        peer
    }
}

impl Drop for RoutedPeer {
    fn drop(&mut self) {
        if let Some(mut listener) = self.listener.take() {
            let _ = listener.kill();
            let _ = listener.wait();
        }
        // Deleting the namespace deletes its veth end, and with it the host's end and route.
        let _ = run(&["ip", "netns", "del", &self.ns]);
        let _ = run(&["ip", "link", "del", &self.host_side]);
    }
}
