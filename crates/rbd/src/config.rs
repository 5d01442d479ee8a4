//! An open image's effective configuration (`rbd config image list`):
//! what librbd really runs with once the pool's and the image's overrides
//! (`rbd config pool set`, `rbd config image set`) replaced what the
//! client asked for.

use std::ffi::CStr;

use crate::error::{check, Result};
use crate::image::Image;
use crate::sys;

/// Where an option's effective value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// The client's own configuration (ceph.conf, `$CEPH_ARGS`, the
    /// monitors' configuration database, or what the client set).
    Client,
    /// The pool's override (`rbd config pool set`).
    Pool,
    /// The image's override (`rbd config image set`).
    Image,
}

/// One librbd option as the image sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigOption {
    pub name: String,
    pub value: String,
    pub source: ConfigSource,
}

impl Image {
    /// Every librbd option with its effective value for this image.
    ///
    /// # Errors
    ///
    /// As librbd reports (refreshing the image or reading the pool's
    /// overrides failed).
    pub fn config(&self) -> Result<Vec<ConfigOption>> {
        let mut max: std::ffi::c_int = 256;
        for _ in 0..8 {
            let len = usize::try_from(max).unwrap_or(0);
            let empty = sys::rbd_config_option_t {
                name: std::ptr::null_mut(),
                value: std::ptr::null_mut(),
                source: 0,
            };
            let mut opts = vec![empty; len];
            let mut n = max;
            // SAFETY: `opts` holds `n` writable entries; librbd fills at
            // most that many (or says how many it needs, with ERANGE).
            let r = unsafe { sys::rbd_config_image_list(self.handle, opts.as_mut_ptr(), &mut n) };
            if r == -libc::ERANGE && n > max {
                max = n;
                continue;
            }
            check(r.into(), || {
                format!("{}: reading the image's configuration", self.name())
            })?;
            let filled = usize::try_from(n).unwrap_or(0).min(len);
            let out = opts[..filled]
                .iter()
                .map(|o| ConfigOption {
                    name: text(o.name),
                    value: text(o.value),
                    source: match o.source {
                        sys::rbd_config_source_t_RBD_CONFIG_SOURCE_POOL => ConfigSource::Pool,
                        sys::rbd_config_source_t_RBD_CONFIG_SOURCE_IMAGE => ConfigSource::Image,
                        _ => ConfigSource::Client,
                    },
                })
                .collect();
            // SAFETY: the `n` entries librbd filled, released once, here.
            unsafe { sys::rbd_config_image_list_cleanup(opts.as_mut_ptr(), n) };
            return Ok(out);
        }
        Err(crate::Error {
            what: format!(
                "{}: reading the image's configuration: the list kept growing",
                self.name()
            ),
            errno: libc::ERANGE,
        })
    }
}

/// A C string librbd allocated (NULL reads as empty).
fn text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string owned by the option list, alive
    // until its cleanup.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
