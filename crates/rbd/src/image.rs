//! An RBD image: opening it, its size, id and features, synchronous and
//! asynchronous I/O, allocation (diff iterate) and metadata.
//!
//! Asynchronous requests (`aio_*`) hand their buffer to librbd and get it
//! back in the completion, which runs on a librbd thread: it must not
//! block. An image stays open while any request on it is in flight (each
//! holds an `Arc` of it).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

use crate::error::{check, Error, Result};
use crate::rados::IoCtx;
use crate::sys;

/// Image feature bits (`rbd info` names them).
pub const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
pub const FEATURE_OBJECT_MAP: u64 = 1 << 3;
pub const FEATURE_FAST_DIFF: u64 = 1 << 4;
pub const FEATURE_JOURNALING: u64 = 1 << 6;

/// An open image.
#[derive(Debug)]
pub struct Image {
    pub(crate) handle: sys::rbd_image_t,
    pub(crate) name: String,
    _io: Arc<IoCtx>,
}

// SAFETY: librbd image handles are used concurrently from many threads by
// design (qemu and tcmu-runner issue I/O on one handle from several); the
// handle is only closed in Drop, when no other reference exists.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

fn cstr(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error {
        what: format!("{what} {s:?} contains a NUL byte"),
        errno: libc::EINVAL,
    })
}

/// Calls `f` with a buffer, growing it while it reports `ERANGE` (after
/// writing the size it needs into `*len`).
fn grow(mut f: impl FnMut(&mut Vec<u8>, &mut usize) -> c_int, what: &str) -> Result<Vec<u8>> {
    let mut len = 256usize;
    for _ in 0..16 {
        let mut buf = vec![0u8; len];
        let mut want = len;
        let r = f(&mut buf, &mut want);
        if r == -libc::ERANGE {
            len = want.max(len * 2);
            continue;
        }
        check(r.into(), || what.to_owned())?;
        return Ok(buf);
    }
    Err(Error {
        what: format!("{what}: the answer kept growing"),
        errno: libc::ERANGE,
    })
}

impl Image {
    /// Opens `name` in `io`'s pool: at snapshot `snap` (read-only), or
    /// the head, read-only or writable.
    ///
    /// # Errors
    ///
    /// No such image or snapshot (`ENOENT`), or no permission.
    pub fn open(io: &Arc<IoCtx>, name: &str, snap: Option<&str>, read_only: bool) -> Result<Self> {
        let n = cstr(name, "image")?;
        let s = snap.map(|s| cstr(s, "snapshot")).transpose()?;
        let s_ptr = s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let mut handle: sys::rbd_image_t = std::ptr::null_mut();
        // SAFETY: io is a valid ioctx kept alive by the Image; strings are
        // NUL-terminated or NULL; handle is written on success.
        let r = unsafe {
            if read_only || snap.is_some() {
                sys::rbd_open_read_only(io.raw(), n.as_ptr(), &mut handle, s_ptr)
            } else {
                sys::rbd_open(io.raw(), n.as_ptr(), &mut handle, s_ptr)
            }
        };
        check(r.into(), || match snap {
            Some(s) => format!("opening image {name}@{s}"),
            None => format!("opening image {name}"),
        })?;
        Ok(Self {
            handle,
            name: name.to_owned(),
            _io: io.clone(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn size(&self) -> Result<u64> {
        let mut size = 0u64;
        // SAFETY: an open image; size is written.
        let r = unsafe { sys::rbd_get_size(self.handle, &mut size) };
        check(r.into(), || format!("{}: reading the size", self.name))?;
        Ok(size)
    }

    /// Feature bits (see the `FEATURE_*` constants).
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn features(&self) -> Result<u64> {
        let mut f = 0u64;
        // SAFETY: an open image; f is written.
        let r = unsafe { sys::rbd_get_features(self.handle, &mut f) };
        check(r.into(), || format!("{}: reading the features", self.name))?;
        Ok(f)
    }

    /// The image's id: fixed at creation, kept across renames.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn id(&self) -> Result<String> {
        let buf = grow(
            |buf, want| {
                // SAFETY: buf is writable for its length, which is passed.
                let r = unsafe { sys::rbd_get_id(self.handle, buf.as_mut_ptr().cast(), buf.len()) };
                *want = buf.len() * 2;
                r
            },
            &format!("{}: reading the image id", self.name),
        )?;
        Ok(nul_terminated(&buf))
    }

    /// The id of snapshot `snap` of this image.
    ///
    /// # Errors
    ///
    /// No such snapshot (`ENOENT`).
    pub fn snap_id(&self, snap: &str) -> Result<u64> {
        let s = cstr(snap, "snapshot")?;
        let mut id = 0u64;
        // SAFETY: an open image, a NUL-terminated name; id is written.
        let r = unsafe { sys::rbd_snap_get_id(self.handle, s.as_ptr(), &mut id) };
        check(r.into(), || {
            format!("{}: finding snapshot {snap}", self.name)
        })?;
        Ok(id)
    }

    /// Reads `buf.len()` bytes at `off`.
    ///
    /// # Errors
    ///
    /// As librbd reports; a short read is `EIO`.
    pub fn read(&self, buf: &mut [u8], off: u64) -> Result<()> {
        // SAFETY: buf is writable for its length for the whole call (the
        // synchronous call returns after the data is in place).
        let r = unsafe { sys::rbd_read2(self.handle, off, buf.len(), buf.as_mut_ptr().cast(), 0) };
        let n = check(r as i64, || format!("{}: read at {off}", self.name))?;
        short(n, buf.len(), || {
            format!("{}: short read at {off}", self.name)
        })
    }

    /// Writes `buf` at `off`; returns once the OSDs acknowledged it (with
    /// the RBD cache off, that is: in the cluster).
    ///
    /// # Errors
    ///
    /// As librbd reports (`ESHUTDOWN`: this client is blocklisted).
    pub fn write(&self, buf: &[u8], off: u64) -> Result<()> {
        // SAFETY: buf is readable for its length during the call.
        let r = unsafe { sys::rbd_write2(self.handle, off, buf.len(), buf.as_ptr().cast(), 0) };
        let n = check(r as i64, || format!("{}: write at {off}", self.name))?;
        short(n, buf.len(), || {
            format!("{}: short write at {off}", self.name)
        })
    }

    /// Makes every completed write stable (writes the RBD cache back when
    /// it is on; without it, acknowledged writes already are).
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn flush(&self) -> Result<()> {
        // SAFETY: an open image.
        let r = unsafe { sys::rbd_flush(self.handle) };
        check(r.into(), || format!("{}: flush", self.name)).map(drop)
    }

    /// Discards a range. Ranges smaller than librbd's discard granularity
    /// (64 KiB by default) may be left as they are: a hint, not zeroing.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn discard(&self, off: u64, len: u64) -> Result<()> {
        // SAFETY: an open image; integer arguments.
        let r = unsafe { sys::rbd_discard(self.handle, off, len) };
        check(r.into(), || format!("{}: discard at {off}", self.name)).map(drop)
    }

    /// Makes a range read as zeroes (whole objects are deallocated, the
    /// rest written with zeroes).
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn write_zeroes(&self, off: u64, len: u64) -> Result<()> {
        let l = usize::try_from(len).map_err(|_| Error {
            what: "zeroing range too long".into(),
            errno: libc::EINVAL,
        })?;
        // SAFETY: an open image; integer arguments.
        let r = unsafe { sys::rbd_write_zeroes(self.handle, off, l, 0, 0) };
        check(r as i64, || format!("{}: write zeroes at {off}", self.name)).map(drop)
    }

    /// Calls `found(offset, len)` for every allocated range in
    /// `[off, off + len)` since the image was created (parent included),
    /// in order. `whole_object` reports whole objects, which the object
    /// map answers without asking the OSDs (only with fast-diff).
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn allocated(
        &self,
        off: u64,
        len: u64,
        whole_object: bool,
        mut found: impl FnMut(u64, u64),
    ) -> Result<()> {
        let mut cb: &mut dyn FnMut(u64, u64) = &mut found;
        // SAFETY: the callback and its argument (a pointer to `cb`) are
        // used only during the synchronous call.
        let r = unsafe {
            sys::rbd_diff_iterate2(
                self.handle,
                std::ptr::null(),
                off,
                len,
                1,
                u8::from(whole_object),
                Some(diff_cb),
                (&mut cb as *mut &mut dyn FnMut(u64, u64)).cast(),
            )
        };
        check(r.into(), || {
            format!("{}: reading allocation at {off}", self.name)
        })
        .map(drop)
    }

    /// One metadata value, `None` if the key is not set.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn metadata_get(&self, key: &str) -> Result<Option<String>> {
        let k = cstr(key, "metadata key")?;
        let result = grow(
            |buf, want| {
                // SAFETY: buf is writable for *want bytes; librbd writes
                // the length it needs into *want on ERANGE.
                unsafe {
                    sys::rbd_metadata_get(self.handle, k.as_ptr(), buf.as_mut_ptr().cast(), want)
                }
            },
            &format!("{}: reading metadata {key}", self.name),
        );
        match result {
            Ok(buf) => Ok(Some(nul_terminated(&buf))),
            Err(e) if e.errno == libc::ENOENT => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets one metadata value (and has librbd tell every client with the
    /// image open that its header changed).
    ///
    /// # Errors
    ///
    /// As librbd reports (`EROFS` on an image opened read-only).
    pub fn metadata_set(&self, key: &str, value: &str) -> Result<()> {
        let (k, v) = (cstr(key, "metadata key")?, cstr(value, "metadata value")?);
        // SAFETY: NUL-terminated strings that outlive the call.
        let r = unsafe { sys::rbd_metadata_set(self.handle, k.as_ptr(), v.as_ptr()) };
        check(r.into(), || {
            format!("{}: setting metadata {key}", self.name)
        })
        .map(drop)
    }

    /// Removes one metadata key; a key that is not there is no error.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn metadata_remove(&self, key: &str) -> Result<()> {
        let k = cstr(key, "metadata key")?;
        // SAFETY: a NUL-terminated string that outlives the call.
        let r = unsafe { sys::rbd_metadata_remove(self.handle, k.as_ptr()) };
        if r == -libc::ENOENT {
            return Ok(());
        }
        check(r.into(), || {
            format!("{}: removing metadata {key}", self.name)
        })
        .map(drop)
    }

    /// Every metadata key starting with `prefix`, with its value.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn metadata_list(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        let mut start = String::new();
        loop {
            let s = cstr(&start, "metadata key")?;
            let mut keys_len = 64 * 1024usize;
            let mut vals_len = 256 * 1024usize;
            let (keys, vals) = loop {
                let mut keys = vec![0u8; keys_len];
                let mut vals = vec![0u8; vals_len];
                let (mut kl, mut vl) = (keys_len, vals_len);
                // SAFETY: both buffers are writable for the lengths passed;
                // librbd writes the lengths it needs on ERANGE.
                let r = unsafe {
                    sys::rbd_metadata_list(
                        self.handle,
                        s.as_ptr(),
                        256,
                        keys.as_mut_ptr().cast::<c_char>(),
                        &mut kl,
                        vals.as_mut_ptr().cast::<c_char>(),
                        &mut vl,
                    )
                };
                if r == -libc::ERANGE && (kl > keys_len || vl > vals_len) && keys_len < 1 << 26 {
                    keys_len = kl.max(keys_len);
                    vals_len = vl.max(vals_len);
                    continue;
                }
                check(r.into(), || format!("{}: listing metadata", self.name))?;
                keys.truncate(kl);
                vals.truncate(vl);
                break (keys, vals);
            };
            let ks: Vec<String> = split_nul(&keys);
            let vs: Vec<String> = split_nul(&vals);
            let n = ks.len();
            for (k, v) in ks.into_iter().zip(vs) {
                start.clone_from(&k);
                if k.starts_with(prefix) {
                    out.push((k, v));
                }
            }
            if n < 256 {
                return Ok(out);
            }
        }
    }

    /// Starts a read of `buf.as_mut().len()` bytes at `off`; `done` gets
    /// the buffer back with the outcome, on a librbd thread.
    pub fn aio_read<B>(
        self: &Arc<Self>,
        off: u64,
        buf: B,
        done: impl FnOnce(B, Result<()>) + Send + 'static,
    ) where
        B: AsMut<[u8]> + Send + 'static,
    {
        let name = self.name.clone();
        self.submit(
            buf,
            move |b: &mut B, image, c| {
                let s = b.as_mut();
                // SAFETY: the buffer lives in the pending request (heap,
                // not moved) until the completion has run.
                unsafe { sys::rbd_aio_read2(image, off, s.len(), s.as_mut_ptr().cast(), c, 0) }
            },
            move |mut b, r| {
                let want = b.as_mut().len();
                let res = check(r, || format!("{name}: read at {off}"))
                    .and_then(|n| short(n, want, || format!("{name}: short read at {off}")));
                done(b, res);
            },
        );
    }

    /// Starts a write of `buf` at `off`; `done` gets the buffer back with
    /// the outcome, on a librbd thread.
    pub fn aio_write<B>(
        self: &Arc<Self>,
        off: u64,
        buf: B,
        done: impl FnOnce(B, Result<()>) + Send + 'static,
    ) where
        B: AsRef<[u8]> + Send + 'static,
    {
        let name = self.name.clone();
        self.submit(
            buf,
            move |b: &mut B, image, c| {
                let s = b.as_ref();
                // SAFETY: as in aio_read.
                unsafe { sys::rbd_aio_write2(image, off, s.len(), s.as_ptr().cast(), c, 0) }
            },
            move |b, r| {
                let want = b.as_ref().len();
                // An asynchronous write completes with 0 (a synchronous
                // one returns its length); librbd writes all or nothing.
                let res = check(r, || format!("{name}: write at {off}")).and_then(|n| match n {
                    0 => Ok(()),
                    n => short(n, want, || format!("{name}: short write at {off}")),
                });
                done(b, res);
            },
        );
    }

    /// Starts a flush.
    pub fn aio_flush(self: &Arc<Self>, done: impl FnOnce(Result<()>) + Send + 'static) {
        let name = self.name.clone();
        self.submit(
            (),
            // SAFETY: an open image and a fresh completion.
            |_, image, c| unsafe { sys::rbd_aio_flush(image, c) },
            move |(), r| done(check(r, || format!("{name}: flush")).map(drop)),
        );
    }

    /// Starts a discard (see [`Self::discard`]).
    pub fn aio_discard(
        self: &Arc<Self>,
        off: u64,
        len: u64,
        done: impl FnOnce(Result<()>) + Send + 'static,
    ) {
        let name = self.name.clone();
        self.submit(
            (),
            // SAFETY: an open image and a fresh completion.
            move |_, image, c| unsafe { sys::rbd_aio_discard(image, off, len, c) },
            move |(), r| done(check(r, || format!("{name}: discard at {off}")).map(drop)),
        );
    }

    /// Starts making a range read as zeroes (see [`Self::write_zeroes`]).
    pub fn aio_write_zeroes(
        self: &Arc<Self>,
        off: u64,
        len: u64,
        done: impl FnOnce(Result<()>) + Send + 'static,
    ) {
        let name = self.name.clone();
        let Ok(l) = usize::try_from(len) else {
            done(Err(Error {
                what: "zeroing range too long".into(),
                errno: libc::EINVAL,
            }));
            return;
        };
        self.submit(
            (),
            // SAFETY: an open image and a fresh completion.
            move |_, image, c| unsafe { sys::rbd_aio_write_zeroes(image, off, l, c, 0, 0) },
            move |(), r| done(check(r, || format!("{name}: write zeroes at {off}")).map(drop)),
        );
    }

    /// Hands one request to librbd: `start` issues it with a completion
    /// whose callback runs `done` with what `keep` held (the buffer) and
    /// librbd's return value.
    pub(crate) fn submit<K, F>(
        self: &Arc<Self>,
        keep: K,
        start: impl FnOnce(&mut K, sys::rbd_image_t, sys::rbd_completion_t) -> c_int,
        done: F,
    ) where
        K: Send + 'static,
        F: FnOnce(K, i64) + Send + 'static,
    {
        let pending = Box::into_raw(Box::new(Pending {
            keep,
            done,
            _image: self.clone(),
        }));
        let mut comp: sys::rbd_completion_t = std::ptr::null_mut();
        // SAFETY: `pending` is a live allocation whose ownership passes to
        // the completion callback, which runs exactly once.
        let r = unsafe {
            sys::rbd_aio_create_completion(pending.cast(), Some(complete::<K, F>), &mut comp)
        };
        if r < 0 {
            // SAFETY: no completion exists, so nothing else owns `pending`.
            let p = unsafe { Box::from_raw(pending) };
            (p.done)(p.keep, r.into());
            return;
        }
        // SAFETY: `pending` stays allocated until the callback; the data
        // pointer `start` takes from `keep` stays valid with it.
        let r = start(unsafe { &mut (*pending).keep }, self.handle, comp);
        if r < 0 {
            // librbd refused the request before queueing it: the
            // completion will never fire.
            // SAFETY: the completion is ours to release, and `pending`
            // returns to us with it.
            unsafe { sys::rbd_aio_release(comp) };
            // SAFETY: as above.
            let p = unsafe { Box::from_raw(pending) };
            (p.done)(p.keep, r.into());
        }
    }
}

struct Pending<K, F> {
    keep: K,
    done: F,
    /// The image stays open while a request is in flight.
    _image: Arc<Image>,
}

unsafe extern "C" fn complete<K, F: FnOnce(K, i64)>(c: sys::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the Pending boxed by `submit` for this completion,
    // and this callback runs once per completion.
    let p = unsafe { Box::from_raw(arg.cast::<Pending<K, F>>()) };
    // SAFETY: a completed completion, released once, here.
    let r = unsafe { sys::rbd_aio_get_return_value(c) };
    // SAFETY: as above.
    unsafe { sys::rbd_aio_release(c) };
    let Pending { keep, done, _image } = *p;
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| done(keep, r as i64)));
}

unsafe extern "C" fn diff_cb(off: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
    if exists == 0 {
        return 0;
    }
    // SAFETY: `arg` points at the `&mut dyn FnMut` of `Image::allocated`,
    // alive for the synchronous call this callback runs within.
    let cb = unsafe { &mut *arg.cast::<&mut dyn FnMut(u64, u64)>() };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(off, len as u64))) {
        Ok(()) => 0,
        Err(_) => -libc::EIO,
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: opened by rbd_open; every pending request holds an Arc,
        // so none is in flight.
        unsafe { sys::rbd_close(self.handle) };
    }
}

fn short(n: u64, want: usize, what: impl FnOnce() -> String) -> Result<()> {
    if n == want as u64 {
        Ok(())
    } else {
        Err(Error {
            what: what(),
            errno: libc::EIO,
        })
    }
}

fn nul_terminated(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `a\0b\0` → `[a, b]`.
fn split_nul(buf: &[u8]) -> Vec<String> {
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_separated_lists() {
        assert_eq!(split_nul(b"a\0bc\0"), vec!["a", "bc"]);
        assert!(split_nul(b"").is_empty());
        assert_eq!(nul_terminated(b"id\0junk"), "id");
    }
}
