//! Extended attributes of a RADOS object, read and compared-and-set in
//! one operation: what makes a decision shared by several clients atomic
//! (two of them that read the same value cannot both replace it).

use std::ffi::c_char;

use crate::error::{check, Error, Result};
use crate::rados::{cstring, IoCtx};
use crate::sys;

impl IoCtx {
    /// The value of attribute `name` of object `oid`; empty when the
    /// object or the attribute does not exist (as the OSDs compare it).
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn xattr(&self, oid: &str, name: &str) -> Result<Vec<u8>> {
        let (o, n) = (cstring(oid, "object")?, cstring(name, "attribute")?);
        let mut len = 256usize;
        for _ in 0..8 {
            let mut buf = vec![0u8; len];
            // SAFETY: buf is writable for its length, which is passed.
            let r = unsafe {
                sys::rados_getxattr(
                    self.raw(),
                    o.as_ptr(),
                    n.as_ptr(),
                    buf.as_mut_ptr().cast::<c_char>(),
                    buf.len(),
                )
            };
            if r == -libc::ENOENT || r == -libc::ENODATA {
                return Ok(Vec::new());
            }
            if r == -libc::ERANGE {
                len *= 4;
                continue;
            }
            let got = check(r.into(), || format!("reading attribute {name} of {oid}"))?;
            buf.truncate(usize::try_from(got).unwrap_or(0));
            return Ok(buf);
        }
        Err(Error {
            what: format!("reading attribute {name} of {oid}: it kept growing"),
            errno: libc::ERANGE,
        })
    }

    /// Sets attribute `name` of object `oid` (creating the object if
    /// needed) to `new`, only if it is still `expected` (empty: not set):
    /// one operation, so of two clients that read the same value only one
    /// replaces it. Returns whether this one did.
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn xattr_compare_and_set(
        &self,
        oid: &str,
        name: &str,
        expected: &[u8],
        new: &[u8],
    ) -> Result<bool> {
        let (o, n) = (cstring(oid, "object")?, cstring(name, "attribute")?);
        let r = self.write_op(&o, true, |op| {
            // SAFETY: op is valid; the strings and slices outlive the
            // write_op call, which is when librados reads them.
            unsafe {
                sys::rados_write_op_cmpxattr(
                    op,
                    n.as_ptr(),
                    sys::LIBRADOS_CMPXATTR_OP_EQ as u8,
                    expected.as_ptr().cast(),
                    expected.len(),
                );
                sys::rados_write_op_setxattr(op, n.as_ptr(), new.as_ptr().cast(), new.len());
            }
        });
        // A comparison that fails cancels the whole operation.
        if r == -libc::ECANCELED {
            return Ok(false);
        }
        check(r.into(), || format!("setting attribute {name} of {oid}"))?;
        Ok(true)
    }
}
