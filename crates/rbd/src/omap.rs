//! An object's key/value map (omap): small values that one client writes
//! often and others list, each write touching one object and notifying
//! nobody (unlike an image's metadata, whose every change librbd announces
//! to every client that has the image open and waits for their answers).

use std::ffi::{c_char, c_int, c_uchar, CStr};

use crate::error::{check, Result};
use crate::rados::{cstring, IoCtx};
use crate::sys;

/// How many entries one read asks for; a longer map is read in turns.
const BATCH: u64 = 256;

impl IoCtx {
    /// Sets `key` to `value` in the map of `oid`, creating the object if
    /// needed.
    ///
    /// # Errors
    ///
    /// The OSDs refused (`ESHUTDOWN` when this client is blocklisted).
    pub fn omap_set(&self, oid: &str, key: &str, value: &[u8]) -> Result<()> {
        let (o, k) = (cstring(oid, "object")?, cstring(key, "key")?);
        let keys = [k.as_ptr()];
        let vals = [value.as_ptr().cast::<c_char>()];
        let lens = [value.len()];
        let r = self.write_op(&o, true, |op| {
            // SAFETY: op is valid; the arrays and what they point to
            // outlive the write_op call, which is when librados reads them.
            unsafe {
                sys::rados_write_op_omap_set(op, keys.as_ptr(), vals.as_ptr(), lens.as_ptr(), 1);
            }
        });
        check(r.into(), || format!("setting {key} in the map of {oid}")).map(drop)
    }

    /// Removes `key` from the map of `oid` (nothing to do when the object
    /// or the key is not there).
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn omap_remove(&self, oid: &str, key: &str) -> Result<()> {
        let (o, k) = (cstring(oid, "object")?, cstring(key, "key")?);
        let keys = [k.as_ptr()];
        let r = self.write_op(&o, false, |op| {
            // SAFETY: op is valid; `keys` outlives the write_op call.
            unsafe { sys::rados_write_op_omap_rm_keys(op, keys.as_ptr(), 1) };
        });
        if r == -libc::ENOENT {
            return Ok(());
        }
        check(r.into(), || format!("removing {key} from the map of {oid}")).map(drop)
    }

    /// The entries of the map of `oid` whose keys start with `prefix`, in
    /// key order; none when the object does not exist.
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn omap_list(&self, oid: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let (o, p) = (cstring(oid, "object")?, cstring(prefix, "prefix")?);
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        loop {
            let after = match out.last() {
                Some((k, _)) => cstring(k, "key")?,
                None => cstring("", "key")?,
            };
            let mut iter: sys::rados_omap_iter_t = std::ptr::null_mut();
            let mut more: c_uchar = 0;
            let mut rval: c_int = 0;
            // SAFETY: a fresh read op, used once and released below.
            let op = unsafe { sys::rados_create_read_op() };
            // SAFETY: op is valid; the strings and the out-parameters
            // outlive the operate call, which fills them.
            let r = unsafe {
                sys::rados_read_op_omap_get_vals2(
                    op,
                    after.as_ptr(),
                    p.as_ptr(),
                    BATCH,
                    &mut iter,
                    &mut more,
                    &mut rval,
                );
                sys::rados_read_op_operate(op, self.raw(), o.as_ptr(), 0)
            };
            let got = if r >= 0 && rval >= 0 && !iter.is_null() {
                // SAFETY: an iterator the successful operation filled,
                // valid until rados_omap_get_end, before the op's release.
                unsafe { drain(iter) }
            } else {
                Vec::new()
            };
            if !iter.is_null() {
                // SAFETY: the iterator is released once, here.
                unsafe { sys::rados_omap_get_end(iter) };
            }
            // SAFETY: op came from rados_create_read_op and is released once.
            unsafe { sys::rados_release_read_op(op) };
            if r == -libc::ENOENT {
                return Ok(out);
            }
            check(r.into(), || format!("listing the map of {oid}"))?;
            check(rval.into(), || format!("listing the map of {oid}"))?;
            let last = got.is_empty();
            out.extend(got);
            if more == 0 || last {
                return Ok(out);
            }
        }
    }
}

/// Every entry an omap iterator still holds.
///
/// # Safety
///
/// `iter` must be a valid iterator not yet ended.
unsafe fn drain(iter: sys::rados_omap_iter_t) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let (mut key, mut val): (*mut c_char, *mut c_char) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut klen, mut vlen) = (0usize, 0usize);
        // SAFETY: the caller's iterator; librados sets the pointers to
        // memory it owns until the iterator ends.
        let r =
            unsafe { sys::rados_omap_get_next2(iter, &mut key, &mut val, &mut klen, &mut vlen) };
        if r < 0 || key.is_null() {
            return out;
        }
        // SAFETY: `key` is NUL-terminated (and `klen` long); `val` holds
        // `vlen` bytes, or is NULL when empty.
        let k = unsafe { CStr::from_ptr(key) }
            .to_string_lossy()
            .into_owned();
        let v = if val.is_null() || vlen == 0 {
            Vec::new()
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(val.cast::<u8>(), vlen) }.to_vec()
        };
        out.push((k, v));
    }
}
