//! The registry of live handles and strings handed across the C ABI.
//!
//! A handle is not a pointer to Rust memory: it is a number from a counter
//! that never repeats, cast to the opaque pointer type the header declares.
//! The registry maps it to the object. So a handle is never dereferenced,
//! and a freed, forged or foreign handle is simply not found: double free
//! and use after free return `PF_ERR_INVALID_HANDLE` instead of touching
//! freed memory, even after the allocator has reused the address.
//!
//! Objects are kept behind `Arc`, and the global lock is held only for the
//! lookup, so calls on different handles (several contexts compiling on
//! several threads) never wait for each other.
//!
//! Strings handed out are real `CString` allocations (callers read them as
//! `char *`); their addresses are registered too so that `pf_string_free`
//! refuses a pointer it did not hand out or has already freed. They are
//! registered masked ([`HIDE`]) so that the registry does not count as a
//! reference: a string the caller never frees is reported by valgrind as
//! definitely lost, which is what CI's leak check looks for.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{ContextState, ResultState};

/// What a live handle refers to.
#[derive(Clone)]
pub(crate) enum Object {
    Context(Arc<Mutex<ContextState>>),
    Result(Arc<ResultState>),
}

/// Handle numbers start high and step by 8 so that a handle looks like an
/// aligned pointer to tools, and small integers (0, 1, -1) are never valid.
const FIRST_ID: u64 = 0x5046_0000_0000;
const STEP: u64 = 8;

static NEXT_ID: AtomicU64 = AtomicU64::new(FIRST_ID);
static OBJECTS: Mutex<Option<HashMap<u64, Object>>> = Mutex::new(None);
static STRINGS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Registered string addresses are stored XOR this mask (0xAAAA...), so no
/// word of the registry looks like a pointer to the string.
const HIDE: usize = usize::MAX / 3 * 2;

/// Locks a registry; a poisoned lock (a panic while it was held, which the
/// code under it cannot raise) still holds consistent data.
fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `object` and returns its new handle number.
pub(crate) fn insert(object: Object) -> u64 {
    let id = NEXT_ID.fetch_add(STEP, Ordering::Relaxed);
    lock(&OBJECTS)
        .get_or_insert_with(HashMap::new)
        .insert(id, object);
    id
}

/// The object of a live handle.
pub(crate) fn get(id: u64) -> Option<Object> {
    lock(&OBJECTS).as_ref().and_then(|m| m.get(&id).cloned())
}

/// Removes a handle when it is live and `is_kind` accepts its object (a
/// context handle given to `pf_result_destroy` stays live); `None`
/// otherwise.
pub(crate) fn remove(id: u64, is_kind: fn(&Object) -> bool) -> Option<Object> {
    let mut objects = lock(&OBJECTS);
    let m = objects.as_mut()?;
    if !m.get(&id).is_some_and(is_kind) {
        return None;
    }
    m.remove(&id)
}

/// Hands out `s` as a C string owned by the caller (freed with
/// `pf_string_free`). Interior NUL bytes, which no polyfuse text contains,
/// are replaced so the text is never cut short silently.
pub(crate) fn give_string(s: &str) -> *mut c_char {
    let c = CString::new(s.replace('\0', "\\0")).unwrap_or_default();
    let p = c.into_raw();
    lock(&STRINGS)
        .get_or_insert_with(HashSet::new)
        .insert(p.addr() ^ HIDE);
    p
}

/// Takes back a string handed out by [`give_string`]; `None` when `p` is
/// not one (or was freed already).
pub(crate) fn take_string(p: *mut c_char) -> Option<CString> {
    let live = lock(&STRINGS)
        .as_mut()
        .map(|s| s.remove(&(p.addr() ^ HIDE)))
        .unwrap_or(false);
    if !live {
        return None;
    }
    // SAFETY: `p` came from `CString::into_raw` in `give_string` and was
    // still registered, so it has not been reclaimed yet; removing it from
    // the registry above makes this the only reclaim.
    Some(unsafe { CString::from_raw(p) })
}
