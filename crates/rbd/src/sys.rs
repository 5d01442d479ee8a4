//! The declarations bindgen generated from `<rados/librados.h>` and
//! `<rbd/librbd.h>` (see build.rs).

#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unused_imports,
    clippy::all,
    clippy::pedantic,
    rustdoc::all
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
