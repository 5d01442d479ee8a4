//! Segmentation and receive offloads of an interface (TSO, GSO, GRO), read
//! with the ethtool ioctl (`SIOCETHTOOL`, `ETHTOOL_G*`) on a socket of the
//! caller's namespace, as `ethtool -k` shows them. sysfs has no file for
//! them.

use std::io;

/// What is on; `None` where the driver does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    pub tso: Option<bool>,
    pub gso: Option<bool>,
    pub gro: Option<bool>,
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GTSO: u32 = 0x1e;
const ETHTOOL_GGSO: u32 = 0x23;
const ETHTOOL_GGRO: u32 = 0x2b;

/// `struct ethtool_value`.
#[repr(C)]
struct Value {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut Value,
    _rest: [u8; 16],
}

/// The offloads of `iface`.
///
/// # Errors
///
/// The socket cannot be made, or the name is not a valid interface name.
pub fn offloads(iface: &str) -> io::Result<Offloads> {
    if iface.is_empty() || iface.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{iface:?} is not an interface name"),
        ));
    }
    // SAFETY: plain socket(2); closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let get = |cmd: u32| -> Option<bool> {
        let mut v = Value { cmd, data: 0 };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: &mut v,
            _rest: [0; 16],
        };
        req.name[..iface.len()].copy_from_slice(iface.as_bytes());
        // SAFETY: `req` is a valid ifreq whose data pointer points at `v`,
        // both alive for the call; the kernel writes only `v.data`.
        let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req) };
        (rc == 0).then_some(v.data != 0)
    };
    let out = Offloads {
        tso: get(ETHTOOL_GTSO),
        gso: get(ETHTOOL_GGSO),
        gro: get(ETHTOOL_GGRO),
    };
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_answers_and_bad_names_are_refused() {
        let lo = offloads("lo").unwrap();
        // Loopback segments in software: GSO is on.
        assert_eq!(lo.gso, Some(true));
        assert!(offloads("").is_err());
        assert!(offloads("a-name-far-too-long").is_err());
        assert_eq!(offloads("nosuch0").unwrap(), Offloads::default());
    }
}
