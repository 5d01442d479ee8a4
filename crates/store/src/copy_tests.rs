//! Copies between files of this host (by the kernel) and within one
//! export (through memory, overlapping either way), read back byte for
//! byte.

use super::*;
use crate::backend::FileBackend;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32) as u8
        })
        .collect()
}

fn file_export(dir: &std::path::Path, name: &str, data: &[u8]) -> Arc<Export> {
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    let b: Arc<dyn Backend> = Arc::new(FileBackend::open(&path, false).unwrap());
    Arc::new(Export::local(name, "", b, false, uuid::Uuid::new_v4()))
}

fn read_all(e: &Export) -> Vec<u8> {
    let b = e.storage.backend().unwrap();
    let mut buf = vec![0u8; e.size() as usize];
    b.read_at(&mut buf, 0).unwrap();
    buf
}

fn end(export: &Arc<Export>, offset: u64) -> End {
    End {
        export: export.clone(),
        offset,
    }
}

#[tokio::test]
async fn files_of_this_host_are_copied_by_the_kernel_in_several_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3 * CHUNK as usize;
    let src = file_export(dir.path(), "a", &pattern(size, 3));
    let dst = file_export(dir.path(), "b", &vec![0u8; size]);
    let len = 2 * CHUNK + 4096;
    let done = copy(&end(&src, 512), &end(&dst, 1024), len, true)
        .await
        .unwrap();
    assert_eq!(
        done,
        Copied {
            in_kernel: len,
            through_memory: 0
        }
    );
    let (a, b) = (read_all(&src), read_all(&dst));
    assert!(b[..1024].iter().all(|&x| x == 0));
    assert!(a[512..512 + len as usize] == b[1024..1024 + len as usize]);
    assert!(b[1024 + len as usize..].iter().all(|&x| x == 0));
}

#[tokio::test]
async fn overlapping_ranges_of_one_export_end_as_if_read_first() {
    let dir = tempfile::tempdir().unwrap();
    let size = 3 * MEMORY_CHUNK as usize;
    for (from, to) in [
        (0u64, 4096u64),
        (4096, 0),
        (MEMORY_CHUNK - 512, MEMORY_CHUNK + 512),
    ] {
        let data = pattern(size, 7);
        let e = file_export(dir.path(), "one", &data);
        let len = MEMORY_CHUNK + 8192;
        let done = copy(&end(&e, from), &end(&e, to), len, false)
            .await
            .unwrap();
        assert_eq!(done.through_memory, len, "{from} -> {to}");
        let mut want = data.clone();
        want.copy_within(from as usize..(from + len) as usize, to as usize);
        assert!(read_all(&e) == want, "{from} -> {to} differs");
    }
}

#[tokio::test]
async fn memory_exports_are_copied_too() {
    let mk = || -> Arc<Export> {
        let b: Arc<dyn Backend> = Arc::new(FileBackend::memory(1 << 20).unwrap());
        Arc::new(Export::local("m", "", b, false, uuid::Uuid::nil()))
    };
    let (src, dst) = (mk(), mk());
    let data = pattern(65536, 1);
    src.storage
        .backend()
        .unwrap()
        .write_at(&data, 0, false)
        .unwrap();
    let done = copy(&end(&src, 0), &end(&dst, 4096), 65536, false)
        .await
        .unwrap();
    assert_eq!(done.in_kernel + done.through_memory, 65536);
    assert!(read_all(&dst)[4096..4096 + 65536] == data[..]);
}

#[tokio::test]
async fn a_range_past_the_end_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let src = file_export(dir.path(), "a", &pattern(8192, 2));
    let dst = file_export(dir.path(), "b", &[0u8; 8192]);
    for (f, t) in [(4097u64, 0u64), (0, 4097), (u64::MAX, 0)] {
        let e = copy(&end(&src, f), &end(&dst, t), 4096, false)
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("past the end"), "{e}");
    }
    assert!(read_all(&dst).iter().all(|&x| x == 0));
}
