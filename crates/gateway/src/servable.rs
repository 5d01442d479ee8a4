//! What an image must be for this gateway to serve it (no cache it did
//! not ask for, no exclusive-lock when written), and the identity every
//! gateway of it reports.

use braid_rbd::Image;
use uuid::Uuid;

use super::lease;
use crate::source::RbdSpec;

/// The namespace of RBD volume identities (UUID version 5).
pub(super) const IDENTITY_NAMESPACE: Uuid =
    Uuid::from_u128(0x6272_6169_642d_4365_8870_6862_6420_7631);

/// What an image's identity is derived from: the cluster, the pool, the
/// namespace and the image by their ids. The default namespace adds
/// nothing, so that the identities of images served before namespaces
/// were known do not change.
pub(super) fn identity_name(scope: &lease::Scope) -> String {
    let mut name = format!("ceph:{}/{}/", scope.fsid, scope.pool);
    if !scope.namespace.is_empty() {
        name.push_str(&scope.namespace);
        name.push('/');
    }
    name.push_str(&scope.image);
    name
}

/// Refuses an image that librbd opened with a cache the gateway did not
/// ask for (`cache.rs`).
pub(super) fn check_cache(image: &Image, spec: &RbdSpec, wanted: bool) -> Result<(), String> {
    let opts = image.config().map_err(|e| format!("{spec}: {e}"))?;
    match super::cache::refusal(spec, &opts, wanted) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// Why a writable export of an image with exclusive-lock is refused, and
/// the command that makes it servable.
pub(super) fn exclusive_lock_refusal(spec: &RbdSpec, features: u64) -> String {
    let needs_lock = [
        (braid_rbd::FEATURE_JOURNALING, "journaling"),
        (braid_rbd::FEATURE_FAST_DIFF, "fast-diff"),
        (braid_rbd::FEATURE_OBJECT_MAP, "object-map"),
        (braid_rbd::FEATURE_EXCLUSIVE_LOCK, "exclusive-lock"),
    ];
    let names: Vec<&str> = needs_lock
        .iter()
        .filter(|(bit, _)| features & bit != 0)
        .map(|(_, n)| *n)
        .collect();
    format!(
        "{spec}: the image has the exclusive-lock feature, with which librbd hands the right to \
         write from one client to the next, so gateways would take turns instead of all \
         writing at once (and a stalled lock holder stops everyone until it is broken). braid \
         serves such an image only --read-only. To serve it writable from any number of \
         gateways, run `rbd feature disable {} {}` while no client has it open",
        spec.rbd_name(),
        names.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_every_feature_to_disable_in_order() {
        let spec: RbdSpec = "rbd/vol".parse().unwrap();
        let all = braid_rbd::FEATURE_EXCLUSIVE_LOCK
            | braid_rbd::FEATURE_OBJECT_MAP
            | braid_rbd::FEATURE_FAST_DIFF
            | 1; // layering
        let m = exclusive_lock_refusal(&spec, all);
        assert!(
            m.contains("rbd feature disable rbd/vol fast-diff object-map exclusive-lock`"),
            "{m}"
        );
        let m = exclusive_lock_refusal(&spec, braid_rbd::FEATURE_EXCLUSIVE_LOCK);
        assert!(
            m.contains("rbd feature disable rbd/vol exclusive-lock`"),
            "{m}"
        );
    }

    #[test]
    fn a_namespace_is_part_of_the_identity_and_the_default_one_adds_nothing() {
        let scope = |namespace: &str| lease::Scope {
            fsid: "f".into(),
            pool: 1,
            namespace: namespace.into(),
            image: "abc".into(),
        };
        assert_eq!(identity_name(&scope("")), "ceph:f/1/abc");
        assert_eq!(identity_name(&scope("tenant")), "ceph:f/1/tenant/abc");
        let spec: RbdSpec = "rbd/tenant/vol".parse().unwrap();
        let m = exclusive_lock_refusal(&spec, braid_rbd::FEATURE_EXCLUSIVE_LOCK);
        assert!(
            m.contains("rbd feature disable rbd/tenant/vol exclusive-lock`"),
            "{m}"
        );
    }

    #[test]
    fn identities_are_version_5_uuids_of_the_names() {
        let a = Uuid::new_v5(&IDENTITY_NAMESPACE, b"ceph:f/1/abc");
        assert_eq!(a.get_version_num(), 5);
        assert_ne!(a, Uuid::new_v5(&IDENTITY_NAMESPACE, b"ceph:f/2/abc"));
    }
}
