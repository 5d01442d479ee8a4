//! Extended attributes of a RADOS object, read and compared-and-set in
//! one operation: what makes a decision shared by several clients atomic
//! (two of them that read the same value cannot both replace it).

use std::ffi::{c_char, c_int, CString};

use crate::error::{check, Error, Result};
use crate::rados::IoCtx;
use crate::sys;

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error {
        what: format!("{what} {s:?} contains a NUL byte"),
        errno: libc::EINVAL,
    })
}

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
        // SAFETY: a fresh write op, used once and released below.
        let op = unsafe { sys::rados_create_write_op() };
        // SAFETY: op is valid; the strings and slices outlive the
        // operate call below, which is when librados reads them.
        let r = unsafe {
            sys::rados_write_op_create(
                op,
                sys::LIBRADOS_CREATE_IDEMPOTENT as c_int,
                std::ptr::null(),
            );
            sys::rados_write_op_cmpxattr(
                op,
                n.as_ptr(),
                sys::LIBRADOS_CMPXATTR_OP_EQ as u8,
                expected.as_ptr().cast(),
                expected.len(),
            );
            sys::rados_write_op_setxattr(op, n.as_ptr(), new.as_ptr().cast(), new.len());
            sys::rados_write_op_operate(op, self.raw(), o.as_ptr(), std::ptr::null_mut(), 0)
        };
        // SAFETY: op came from rados_create_write_op and is released once.
        unsafe { sys::rados_release_write_op(op) };
        // A comparison that fails cancels the whole operation.
        if r == -libc::ECANCELED {
            return Ok(false);
        }
        check(r.into(), || format!("setting attribute {name} of {oid}"))?;
        Ok(true)
    }
}
