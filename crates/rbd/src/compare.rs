//! COMPARE AND WRITE on an image: librbd's compare-and-write, which the
//! OSD holding the object carries out as one operation (so no other
//! client's write lands between the compare and the write), and the
//! offset of the first byte that differed read out of what librbd says.

use std::ffi::c_int;
use std::sync::Arc;

use crate::error::{check, Error, Result};
use crate::image::Image;
use crate::sys;

impl Image {
    /// The size of the image's objects in bytes.
    ///
    /// # Errors
    ///
    /// As librbd reports.
    pub fn object_size(&self) -> Result<u64> {
        // SAFETY: rbd_image_info_t is plain data, valid when zeroed.
        let mut info: sys::rbd_image_info_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<sys::rbd_image_info_t>();
        // SAFETY: an open image; info is written, and its size given.
        let r = unsafe { sys::rbd_stat(self.handle, &mut info, size) };
        check(r.into(), || {
            format!("{}: reading its object size", self.name)
        })?;
        Ok(info.obj_size)
    }

    /// Starts a compare-and-write of `data` at `off`: librbd writes it
    /// only if the image there equals `cmp` (as long), in one operation
    /// on the OSD that holds the object, so no other client's write lands
    /// between the compare and the write. `done` gets `None` once written,
    /// or `Some(at)`: not written, `at` being the first byte (from `off`)
    /// that differed. The range must lie within one object.
    pub fn aio_compare_and_write(
        self: &Arc<Self>,
        off: u64,
        cmp: Vec<u8>,
        data: Vec<u8>,
        done: impl FnOnce(Result<Option<u64>>) + Send + 'static,
    ) {
        if cmp.len() != data.len() {
            done(Err(Error {
                what: "compare-and-write: the compared and written data differ in length".into(),
                errno: libc::EINVAL,
            }));
            return;
        }
        let name = self.name.clone();
        let len = cmp.len() as u64;
        let object = match self.object_size() {
            Ok(o) => o,
            Err(e) => return done(Err(e)),
        };
        self.submit(
            (cmp, data, 0u64),
            move |(cmp, data, mismatch): &mut (Vec<u8>, Vec<u8>, u64), image, c| {
                // SAFETY: both buffers and the mismatch offset live in the
                // pending request (heap, not moved) until the completion
                // has run.
                unsafe {
                    sys::rbd_aio_compare_and_write(
                        image,
                        off,
                        cmp.len(),
                        cmp.as_ptr().cast(),
                        data.as_ptr().cast(),
                        c,
                        mismatch,
                        0,
                    ) as c_int
                }
            },
            move |(_, _, mismatch), r| {
                // A miscompare completes with -EILSEQ and the image offset
                // of the first byte that differed.
                if r == -i64::from(libc::EILSEQ) {
                    done(
                        mismatch_within(mismatch, off, len, object)
                            .ok_or_else(|| Error {
                                what: format!(
                            "{name}: compare and write at {off}: librbd named byte {mismatch} as \
                             the first that differed, outside the range compared"
                        ),
                                errno: libc::EIO,
                            })
                            .map(Some),
                    );
                } else {
                    done(check(r, || format!("{name}: compare and write at {off}")).map(|_| None));
                }
            },
        );
    }
}

/// The first byte that differed, from the start of a compare-and-write
/// of `len` bytes at `off`, out of librbd's `mismatch`: the image offset
/// of that byte in some releases, and in others (16.2.15's, as measured) the image
/// offset of the start of its object plus the byte's offset in the
/// compared data. A compare-and-write stays within one object, and one of
/// a block or less at a block's offset cannot be read both ways unless
/// the two agree (`off` is the object's start). `None`: neither.
fn mismatch_within(mismatch: u64, off: u64, len: u64, object: u64) -> Option<u64> {
    let start = off - off % object.max(1);
    [off, start]
        .into_iter()
        .find(|base| (*base..*base + len).contains(&mismatch))
        .map(|base| mismatch - base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_is_read_from_either_base() {
        let (off, object) = ((4 << 20) + 1536, 4 << 20);
        assert_eq!(mismatch_within(off + 37, off, 512, object), Some(37));
        assert_eq!(mismatch_within((4 << 20) + 37, off, 512, object), Some(37));
        assert_eq!(mismatch_within(5, 0, 512, object), Some(5));
        assert_eq!(mismatch_within(off + 512, off, 512, object), None);
    }
}
