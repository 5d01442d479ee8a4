//! The cluster connection, pools, blocklisting, and watch/notify on an
//! object.
//!
//! librados handles are thread-safe for everything used here (its docs:
//! only changing an I/O context's namespace or snapshot is not), so the
//! wrappers are `Send + Sync`. An [`IoCtx`] keeps its [`Cluster`] alive, and
//! a [`Watch`] its [`IoCtx`]: Ceph requires them destroyed in that order.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{check, Error, Result};
use crate::notify_reply::{parse_notify_reply, NotifyOutcome};
use crate::sys;

/// How to reach the cluster.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    /// A ceph.conf; `None` reads Ceph's usual places (`$CEPH_CONF`,
    /// `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The cephx user without `client.` (`None`: `admin`). Its keyring is
    /// found where the configuration says (`keyring = ...`) or in Ceph's
    /// usual places (`/etc/ceph/ceph.client.ID.keyring`, ...).
    pub id: Option<String>,
    /// Settings applied after the file and `$CEPH_ARGS`, e.g.
    /// `("rbd_cache", "false")`.
    pub settings: Vec<(String, String)>,
}

/// A connected librados client: one client instance to the cluster, with
/// its own address (what a blocklist names) and global id.
#[derive(Debug)]
pub struct Cluster {
    handle: sys::rados_t,
}

// SAFETY: a connected rados_t is used from any thread by librados'
// own design (its C API documents no thread affinity; the C++ client
// behind it locks internally).
unsafe impl Send for Cluster {}
// SAFETY: as above; every method takes &self and librados locks.
unsafe impl Sync for Cluster {}

pub(crate) fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error {
        what: format!("{what} {s:?} contains a NUL byte"),
        errno: libc::EINVAL,
    })
}

impl Cluster {
    /// Reads the configuration and connects.
    ///
    /// # Errors
    ///
    /// No configuration or keyring found, the monitors unreachable, or
    /// authentication refused; the message says which.
    pub fn connect(opts: &ConnectOptions) -> Result<Self> {
        let id = opts
            .id
            .as_deref()
            .map(|i| cstring(i, "ceph id"))
            .transpose()?;
        let mut handle: sys::rados_t = std::ptr::null_mut();
        // SAFETY: handle is written on success; id is NUL-terminated or
        // NULL (the default user).
        let r = unsafe {
            sys::rados_create(
                &mut handle,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        check(r.into(), || "creating a ceph client".into())?;
        // From here Drop shuts the handle down, whatever fails next.
        let cluster = Self { handle };
        let conf = opts
            .conf
            .as_ref()
            .map(|p| cstring(&p.display().to_string(), "ceph.conf path"))
            .transpose()?;
        // SAFETY: a created handle and a NUL-terminated path or NULL.
        let r = unsafe {
            sys::rados_conf_read_file(
                cluster.handle,
                conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        check(r.into(), || match &opts.conf {
            Some(p) => format!("reading {}", p.display()),
            None => "finding a ceph.conf ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, \
                     ./ceph.conf; or name one with --ceph-conf)"
                .into(),
        })?;
        // SAFETY: NULL selects CEPH_ARGS.
        let r = unsafe { sys::rados_conf_parse_env(cluster.handle, std::ptr::null()) };
        check(r.into(), || "reading $CEPH_ARGS".into())?;
        for (k, v) in &opts.settings {
            cluster.set(k, v)?;
        }
        // SAFETY: a configured handle.
        let r = unsafe { sys::rados_connect(cluster.handle) };
        check(r.into(), || {
            format!(
                "connecting to the cluster as client.{} (check the monitors named in the \
                 configuration and the user's keyring)",
                opts.id.as_deref().unwrap_or("admin")
            )
        })?;
        Ok(cluster)
    }

    /// Sets one configuration option.
    ///
    /// # Errors
    ///
    /// An unknown option or a value it does not take.
    pub fn set(&self, key: &str, value: &str) -> Result<()> {
        let (k, v) = (cstring(key, "option")?, cstring(value, "value")?);
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let r = unsafe { sys::rados_conf_set(self.handle, k.as_ptr(), v.as_ptr()) };
        check(r.into(), || format!("setting {key} = {value}")).map(drop)
    }

    /// One configuration option's value.
    ///
    /// # Errors
    ///
    /// An unknown option.
    pub fn get(&self, key: &str) -> Result<String> {
        let k = cstring(key, "option")?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf is writable for its length, which is passed.
        let r = unsafe {
            sys::rados_conf_get(self.handle, k.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        check(r.into(), || format!("reading option {key}"))?;
        Ok(c_string(&buf))
    }

    /// The cluster's fsid, as `ceph fsid` prints it.
    ///
    /// # Errors
    ///
    /// Not connected.
    pub fn fsid(&self) -> Result<String> {
        let mut buf = [0u8; 64];
        // SAFETY: buf is writable for its length (37 bytes are needed).
        let r = unsafe { sys::rados_cluster_fsid(self.handle, buf.as_mut_ptr().cast(), buf.len()) };
        check(r.into(), || "reading the cluster fsid".into())?;
        Ok(c_string(&buf))
    }

    /// This client's global id (`client.<id>` in the cluster's eyes; what
    /// a notify reply names watchers by).
    pub fn instance_id(&self) -> u64 {
        // SAFETY: a connected handle.
        unsafe { sys::rados_get_instance_id(self.handle) }
    }

    /// This client's address as a blocklist names it
    /// (`127.0.0.1:0/3735928559`).
    ///
    /// # Errors
    ///
    /// Not connected.
    pub fn addrs(&self) -> Result<String> {
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: on success `out` is a strdup'd C string we must free.
        let r = unsafe { sys::rados_getaddrs(self.handle, &mut out) };
        check(r.into(), || "reading this client's address".into())?;
        if out.is_null() {
            return Err(Error {
                what: "librados returned no client address".into(),
                errno: libc::EIO,
            });
        }
        // SAFETY: a valid C string from strdup, freed once, here.
        let s = unsafe { CStr::from_ptr(out) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by strdup in librados.
        unsafe { libc::free(out.cast()) };
        Ok(s)
    }

    /// Has the OSDs refuse every operation of the client at `addr` for
    /// `expire` (`ceph osd blocklist add ADDR SECONDS`; `None`: Ceph's
    /// default, an hour), then waits until
    /// this client has the OSD map that says so: every operation this
    /// client sends from now on carries that map's epoch, and no OSD
    /// executes it before it knows of the blocklist.
    ///
    /// # Errors
    ///
    /// `EACCES` when this user's monitor capabilities do not allow `osd
    /// blocklist`; the monitors unreachable.
    pub fn blocklist_add(&self, addr: &str, expire: Option<Duration>) -> Result<()> {
        let a = cstring(addr, "client address")?;
        let secs = expire.map_or(0, |e| u32::try_from(e.as_secs().max(1)).unwrap_or(u32::MAX));
        // SAFETY: the address is NUL-terminated; librados only reads it
        // (the header lacks const).
        let r = unsafe { sys::rados_blocklist_add(self.handle, a.as_ptr().cast_mut(), secs) };
        check(r.into(), || format!("blocklisting {addr}"))?;
        self.wait_for_latest_osdmap()
    }

    /// Waits until this client has the newest OSD map the monitors have.
    ///
    /// # Errors
    ///
    /// The monitors unreachable.
    pub fn wait_for_latest_osdmap(&self) -> Result<()> {
        // SAFETY: a connected handle.
        let r = unsafe { sys::rados_wait_for_latest_osdmap(self.handle) };
        check(r.into(), || "waiting for the latest OSD map".into()).map(drop)
    }

    /// An I/O context on `pool`, inside RADOS `namespace` (`None`: the
    /// pool's default namespace). Every object it names, and every image
    /// opened on it, lives in that namespace.
    ///
    /// # Errors
    ///
    /// No such pool (`ENOENT`), or no permission.
    pub fn ioctx(self: &Arc<Self>, pool: &str, namespace: Option<&str>) -> Result<Arc<IoCtx>> {
        let p = cstring(pool, "pool")?;
        let ns = namespace.map(|n| cstring(n, "namespace")).transpose()?;
        let mut io: sys::rados_ioctx_t = std::ptr::null_mut();
        // SAFETY: io is written on success; the pool name is NUL-terminated.
        let r = unsafe { sys::rados_ioctx_create(self.handle, p.as_ptr(), &mut io) };
        check(r.into(), || format!("opening pool {pool}"))?;
        let io = IoCtx {
            handle: io,
            cluster: self.clone(),
            namespace: namespace.unwrap_or_default().to_owned(),
        };
        if let Some(ns) = ns {
            // SAFETY: a valid ioctx that no other thread has seen yet (the
            // one moment librados allows the namespace to change); the
            // name is NUL-terminated and copied by librados.
            unsafe { sys::rados_ioctx_set_namespace(io.handle, ns.as_ptr()) };
        }
        Ok(Arc::new(io))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle was created by rados_create and every IoCtx
        // (which holds an Arc to this) is gone.
        unsafe { sys::rados_shutdown(self.handle) };
    }
}

/// An I/O context: one pool of one cluster.
#[derive(Debug)]
pub struct IoCtx {
    handle: sys::rados_ioctx_t,
    cluster: Arc<Cluster>,
    /// Set once, before the context is shared.
    namespace: String,
}

// SAFETY: librados I/O contexts may be used from several threads at once
// as long as their namespace and snapshot do not change, which this
// wrapper never does after creation.
unsafe impl Send for IoCtx {}
// SAFETY: as above.
unsafe impl Sync for IoCtx {}

/// A notification delivered to a [`Watch`].
#[derive(Clone, Debug)]
pub struct Notification {
    pub notify_id: u64,
    /// The watch it came to (for [`IoCtx::notify_ack`]).
    pub cookie: u64,
    /// The global id of the client that sent it.
    pub notifier: u64,
    pub data: Vec<u8>,
}

impl IoCtx {
    pub(crate) fn raw(&self) -> sys::rados_ioctx_t {
        self.handle
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The RADOS namespace it works in (empty: the pool's default one).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pool's id: fixed at creation, kept across renames.
    pub fn pool_id(&self) -> i64 {
        // SAFETY: a valid ioctx.
        unsafe { sys::rados_ioctx_get_id(self.handle) }
    }

    /// Creates `oid` if it does not exist (leaving it as it is if it does).
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn touch(&self, oid: &str) -> Result<()> {
        let o = cstring(oid, "object")?;
        let r = self.write_op(&o, true, |_| {});
        check(r.into(), || format!("creating object {oid}")).map(drop)
    }

    /// Runs one write operation on `oid`, atomically: a fresh operation
    /// (that first creates the object if it does not exist, with
    /// `create`), to which `fill` adds its steps, executed and released.
    /// Returns librados' result. What `fill` hands librados is read during
    /// this call only.
    pub(crate) fn write_op(
        &self,
        oid: &CStr,
        create: bool,
        fill: impl FnOnce(sys::rados_write_op_t),
    ) -> c_int {
        // SAFETY: a fresh write op, used once and released below.
        let op = unsafe { sys::rados_create_write_op() };
        if create {
            // SAFETY: op is valid; an idempotent create with no category.
            unsafe {
                sys::rados_write_op_create(
                    op,
                    sys::LIBRADOS_CREATE_IDEMPOTENT as c_int,
                    std::ptr::null(),
                )
            };
        }
        fill(op);
        // SAFETY: op, ioctx and the NUL-terminated name are valid; no mtime.
        let r = unsafe {
            sys::rados_write_op_operate(op, self.handle, oid.as_ptr(), std::ptr::null_mut(), 0)
        };
        // SAFETY: op came from rados_create_write_op and is released once.
        unsafe { sys::rados_release_write_op(op) };
        r
    }

    /// Watches `oid`: `on_notify` runs for each notification (on a
    /// librados thread: it must not block; acknowledge with
    /// [`Self::notify_ack`], from any thread), `on_error` when the watch
    /// broke (the errno; `ESHUTDOWN` when blocklisted) and must be
    /// replaced. The OSD drops the watch of a client silent for `timeout`.
    ///
    /// # Errors
    ///
    /// No such object, or the OSDs refused.
    pub fn watch(
        self: &Arc<Self>,
        oid: &str,
        timeout: Duration,
        on_notify: impl Fn(Notification) + Send + Sync + 'static,
        on_error: impl Fn(i32) + Send + Sync + 'static,
    ) -> Result<Watch> {
        let o = cstring(oid, "object")?;
        let callbacks = Box::into_raw(Box::new(WatchCallbacks {
            notify: Box::new(on_notify),
            error: Box::new(on_error),
        }));
        let mut cookie = 0u64;
        // SAFETY: `callbacks` stays allocated until the Watch is dropped,
        // after rados_unwatch2 and rados_watch_flush guarantee no callback
        // runs any more.
        let secs = u32::try_from(timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        let r = unsafe {
            sys::rados_watch3(
                self.handle,
                o.as_ptr(),
                &mut cookie,
                Some(watch_notify),
                Some(watch_error),
                secs,
                callbacks.cast(),
            )
        };
        if r < 0 {
            // SAFETY: the watch was not registered: nobody else holds it.
            drop(unsafe { Box::from_raw(callbacks) });
            return Err(Error {
                what: format!("watching object {oid}"),
                errno: -r,
            });
        }
        Ok(Watch {
            io: self.clone(),
            cookie,
            callbacks,
        })
    }

    /// Acknowledges a notification (with no payload).
    ///
    /// # Errors
    ///
    /// The OSDs refused.
    pub fn notify_ack(&self, oid: &str, notify_id: u64, cookie: u64) -> Result<()> {
        let o = cstring(oid, "object")?;
        // SAFETY: valid handle and name; no payload.
        let r = unsafe {
            sys::rados_notify_ack(
                self.handle,
                o.as_ptr(),
                notify_id,
                cookie,
                std::ptr::null(),
                0,
            )
        };
        check(r.into(), || {
            format!("acknowledging a notification on {oid}")
        })
        .map(drop)
    }

    /// Notifies every watch of `oid` and waits up to `timeout` for their
    /// acknowledgements; which ones did not answer in time is part of the
    /// outcome, not an error.
    ///
    /// # Errors
    ///
    /// No such object, or the OSDs refused.
    pub fn notify(&self, oid: &str, data: &[u8], timeout: Duration) -> Result<NotifyOutcome> {
        let o = cstring(oid, "object")?;
        let len = c_int::try_from(data.len()).map_err(|_| Error {
            what: "notification payload too large".into(),
            errno: libc::EINVAL,
        })?;
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: data is readable for len bytes; reply is allocated by
        // librados (even on -ETIMEDOUT) and freed below.
        let r = unsafe {
            sys::rados_notify2(
                self.handle,
                o.as_ptr(),
                data.as_ptr().cast(),
                len,
                u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                &mut reply,
                &mut reply_len,
            )
        };
        let outcome = if reply.is_null() {
            NotifyOutcome::default()
        } else {
            // SAFETY: librados wrote reply_len bytes at reply.
            let bytes = unsafe { std::slice::from_raw_parts(reply.cast::<u8>(), reply_len) };
            let parsed = parse_notify_reply(bytes);
            // SAFETY: allocated by librados for us, freed once.
            unsafe { sys::rados_buffer_free(reply) };
            parsed.ok_or_else(|| Error {
                what: format!("decoding the reply to a notification on {oid}"),
                errno: libc::EIO,
            })?
        };
        if r < 0 && r != -libc::ETIMEDOUT {
            return Err(Error {
                what: format!("notifying the watchers of {oid}"),
                errno: -r,
            });
        }
        Ok(outcome)
    }
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; every Watch and Image
        // using it holds an Arc to it, so none is left.
        unsafe { sys::rados_ioctx_destroy(self.handle) };
    }
}

struct WatchCallbacks {
    notify: Box<dyn Fn(Notification) + Send + Sync>,
    error: Box<dyn Fn(i32) + Send + Sync>,
}

unsafe extern "C" fn watch_notify(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    notifier: u64,
    data: *mut c_void,
    len: usize,
) {
    // SAFETY: arg is the WatchCallbacks registered with this watch, alive
    // until after rados_watch_flush (see Watch::drop).
    let cb = unsafe { &*arg.cast::<WatchCallbacks>() };
    let data = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: librados passes len readable bytes at data.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
    };
    let n = Notification {
        notify_id,
        cookie,
        notifier,
        data,
    };
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (cb.notify)(n)));
}

unsafe extern "C" fn watch_error(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in watch_notify.
    let cb = unsafe { &*arg.cast::<WatchCallbacks>() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (cb.error)(err.abs())));
}

/// A registered watch; dropping it unregisters it and waits until no
/// callback of it runs.
pub struct Watch {
    io: Arc<IoCtx>,
    cookie: u64,
    callbacks: *mut WatchCallbacks,
}

// SAFETY: the callbacks are Send + Sync closures; the cookie is a number.
unsafe impl Send for Watch {}
// SAFETY: as above.
unsafe impl Sync for Watch {}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("cookie", &self.cookie)
            .finish()
    }
}

impl Watch {
    /// The cookie notifications name this watch by.
    pub fn cookie(&self) -> u64 {
        self.cookie
    }

    /// How long ago the OSD last confirmed the watch, or why it broke.
    ///
    /// # Errors
    ///
    /// The errno librados reports for the broken watch.
    pub fn check(&self) -> Result<Duration> {
        // SAFETY: a registered cookie on its own ioctx.
        let r = unsafe { sys::rados_watch_check(self.io.raw(), self.cookie) };
        check(r.into(), || "checking a watch".into()).map(Duration::from_millis)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: the cookie was registered on this ioctx; after unwatch
        // and flush no callback can still be running or start, so the
        // callbacks may be freed.
        unsafe {
            sys::rados_unwatch2(self.io.raw(), self.cookie);
            sys::rados_watch_flush(self.io.cluster.handle);
            drop(Box::from_raw(self.callbacks));
        }
    }
}

/// The text before the first NUL of `buf`.
fn c_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
