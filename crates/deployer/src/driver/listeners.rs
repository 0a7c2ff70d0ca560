//! Foreign listeners: before hapwright starts a managed HAProxy, it looks for another
//! process already listening on one of the config's `bind` addresses. HAProxy binds
//! with `SO_REUSEPORT`, so a second HAProxy on the same port starts without an error
//! and the kernel then splits connections between the two: half the traffic would go
//! to a config hapwright does not manage, unnoticed. The check reads the kernel's
//! socket tables (`/proc/net/tcp`, `/proc/net/tcp6`) and names the owner from
//! `/proc/<pid>/fd`; processes running this instance's own `haproxy.cfg` (an earlier
//! master's workers still draining) are not foreign.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use crate::haproxy::config as haproxy_config;

/// A TCP address a `bind` line listens on; `ip: None` is every address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BindAddress {
    /// The address, or `None` for a wildcard (`:80`, `*:80`, `0.0.0.0:80`, `[::]:80`).
    pub ip: Option<IpAddr>,
    /// The port.
    pub port: u16,
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ip {
            None => write!(f, "*:{}", self.port),
            Some(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Some(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

/// The TCP addresses of every `bind` line of `config` (a rendered `haproxy.cfg`,
/// read by hapwright's HAProxy tokenizer, so quoting, escapes and comments are
/// HAProxy's), with `${VAR}` taken from `env` and then from hapwright's own
/// environment, as HAProxy would. Unix sockets, `fd@`, QUIC, port ranges and host
/// names are skipped.
pub fn bind_addresses(config: &str, env: &BTreeMap<String, String>) -> Vec<BindAddress> {
    let (model, _) = haproxy_config::parse_lenient(config);
    let mut found = Vec::new();
    for bind in model
        .sections
        .iter()
        .flat_map(|section| section.directives_named("bind"))
    {
        let Some(list) = bind.args.first() else {
            continue;
        };
        let list = expand(list, env);
        for address in list.split(',') {
            if let Some(bind) = parse_address(address) {
                found.push(bind);
            }
        }
    }
    found
}

fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let name = &rest[start + 2..start + end];
        let value = env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .unwrap_or_default();
        out.push_str(&value);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

fn parse_address(address: &str) -> Option<BindAddress> {
    let address = ["ipv4@", "ipv6@", "tcp@", "tcp4@", "tcp6@"]
        .iter()
        .find_map(|prefix| address.strip_prefix(prefix))
        .unwrap_or(address);
    if address.contains('@') || address.starts_with('/') {
        return None;
    }
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match host {
        "" | "*" => None,
        host => match host.parse::<IpAddr>().ok()? {
            ip if ip.is_unspecified() => None,
            ip => Some(ip),
        },
    };
    Some(BindAddress { ip, port })
}

/// A listening socket found in the kernel's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Listener {
    ip: IpAddr,
    port: u16,
    inode: u64,
}

/// Listening TCP sockets from `/proc/net/tcp` and `/proc/net/tcp6`.
fn listeners() -> Vec<Listener> {
    let mut found = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        found.extend(
            text.lines()
                .skip(1)
                .filter_map(|line| parse_proc_line(line, v6)),
        );
    }
    found
}

/// One line of `/proc/net/tcp{,6}` when it is a listening socket (state `0A`).
fn parse_proc_line(line: &str, v6: bool) -> Option<Listener> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let (address, port) = fields.get(1)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    // The kernel prints each 32-bit word of the address in host (little-endian) order.
    let words: Vec<u32> = (0..address.len() / 8)
        .map(|i| u32::from_str_radix(&address[i * 8..i * 8 + 8], 16).map(u32::from_be))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip = if v6 {
        let mut bytes = [0u8; 16];
        for (i, word) in words.iter().enumerate().take(4) {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word.to_be_bytes());
        }
        let ip = Ipv6Addr::from(bytes);
        ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4)
    } else {
        IpAddr::V4(Ipv4Addr::from(words.first()?.to_be_bytes()))
    };
    Some(Listener { ip, port, inode })
}

fn overlaps(bind: &BindAddress, listener: &Listener) -> bool {
    bind.port == listener.port
        && (bind.ip.is_none() || listener.ip.is_unspecified() || bind.ip == Some(listener.ip))
}

/// Process id and name of every process holding one of `inodes`.
fn owners(inodes: &[u64]) -> HashMap<u64, (u32, String)> {
    let mut found = HashMap::new();
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return found;
    };
    for pid in processes.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            if inodes.contains(&inode) {
                let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|n| n.trim().to_owned())
                    .unwrap_or_else(|_| "unknown".to_owned());
                found.entry(inode).or_insert((pid, name));
            }
        }
    }
    found
}

/// Refuses to start when another process listens on one of the `bind` addresses of
/// `config_file`: the message names each address and its owner (`haproxy`, pid).
/// Processes that run `config_file` themselves (`is_own`) do not count.
pub fn check_foreign(
    config_file: &Path,
    env: &BTreeMap<String, String>,
    is_own: impl Fn(u32) -> bool,
) -> Result<(), Foreign> {
    let Ok(config) = std::fs::read_to_string(config_file) else {
        return Ok(());
    };
    let binds = bind_addresses(&config, env);
    if binds.is_empty() {
        return Ok(());
    }
    let busy: Vec<(BindAddress, Listener)> = listeners()
        .into_iter()
        .filter_map(|l| binds.iter().find(|b| overlaps(b, &l)).map(|b| (*b, l)))
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    let inodes: Vec<u64> = busy.iter().map(|(_, l)| l.inode).collect();
    let owners = owners(&inodes);
    let mut conflicts: Vec<Conflict> = busy
        .iter()
        .filter(|(_, l)| owners.get(&l.inode).is_none_or(|(pid, _)| !is_own(*pid)))
        .map(|(bind, l)| Conflict {
            bind: *bind,
            owner: owners.get(&l.inode).cloned(),
        })
        .collect();
    conflicts.dedup();
    if conflicts.is_empty() {
        Ok(())
    } else {
        Err(Foreign(conflicts))
    }
}

/// Why a start is refused: `bind` addresses other processes already serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "not starting HAProxy: {}; stop that process or change the bind address",
    list(.0)
)]
pub struct Foreign(pub Vec<Conflict>);

/// One `bind` address another process serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The address.
    pub bind: BindAddress,
    /// The process serving it (pid and name), when hapwright can see it.
    pub owner: Option<(u32, String)>,
}

impl std::fmt::Display for Conflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some((pid, name)) => write!(f, "{} is already served by {name} (pid {pid})", self.bind),
            None => write!(
                f,
                "{} is already served by a process hapwright cannot see",
                self.bind
            ),
        }
    }
}

fn list(conflicts: &[Conflict]) -> String {
    conflicts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_lines_give_their_tcp_addresses() {
        let env: BTreeMap<String, String> = [("PORT".to_owned(), "8080".to_owned())].into();
        let config = "\
frontend fe
    bind :80
    bind 127.0.0.1:${PORT},ipv4@10.0.0.1:81 ssl crt certs/x.pem
    bind \"[::1]:443\"
    bind unix@/run/x.sock
    bind /run/y.sock
    bind quic4@:443
    bind 0.0.0.0:8443
listen stats
    bind 127.0.0.2:82# a comment ends the word, as in HAProxy
";
        let shown: Vec<String> = bind_addresses(config, &env)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "*:80",
                "127.0.0.1:8080",
                "10.0.0.1:81",
                "[::1]:443",
                "*:8443",
                "127.0.0.2:82"
            ]
        );
    }

    #[test]
    fn proc_lines_decode_listening_sockets() {
        let v4 = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_proc_line(v4, false),
            Some(Listener {
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                port: 8080,
                inode: 12345
            })
        );
        let v6 = "   1: 00000000000000000000000001000000:01BB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_proc_line(v6, true),
            Some(Listener {
                ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
                port: 443,
                inode: 777
            })
        );
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(parse_proc_line(&established, false), None);
    }

    #[test]
    fn a_listener_on_a_bind_port_is_found_with_its_owner() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, format!("frontend fe\n    bind 127.0.0.1:{port}\n")).unwrap();
        let error = check_foreign(&file, &BTreeMap::new(), |_| false)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!(
                "127.0.0.1:{port} is already served by {} (pid {})",
                std::fs::read_to_string("/proc/self/comm").unwrap().trim(),
                std::process::id()
            )),
            "{error}"
        );
        // Our own processes are not foreign.
        assert_eq!(
            check_foreign(&file, &BTreeMap::new(), |pid| pid == std::process::id()),
            Ok(())
        );
        drop(taken);
        assert_eq!(check_foreign(&file, &BTreeMap::new(), |_| false), Ok(()));
    }
}
