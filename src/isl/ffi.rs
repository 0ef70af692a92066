//! Raw declarations for the isl functions isl-rs does not bind, and the only
//! `unsafe` code of polyfuse's isl side.
//!
//! * The AST builder (`isl_ast_build_*`), which turns a schedule tree into an
//!   AST for codegen.
//! * `isl_*_to_str` with the returned string freed: isl-rs's `to_str`
//!   returns a borrowed view of a string it never frees.
//! * isl's operation quota lowered from another thread ([`Abort`]).

use isl_rs::{ASTExpr, ASTNode, PwAff, Schedule, Set};
use libc::{c_char, uintptr_t};
use std::cell::RefCell;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

extern "C" {
    fn isl_options_set_ast_build_scale_strides(ctx: uintptr_t, val: i32) -> i32;
    fn isl_ast_build_from_context(set: uintptr_t) -> uintptr_t;
    fn isl_ast_build_node_from_schedule(build: uintptr_t, schedule: uintptr_t) -> uintptr_t;
    fn isl_ast_build_expr_from_pw_aff(build: uintptr_t, pa: uintptr_t) -> uintptr_t;
    fn isl_ast_build_expr_from_set(build: uintptr_t, set: uintptr_t) -> uintptr_t;
    fn isl_ast_build_free(build: uintptr_t) -> uintptr_t;
    fn isl_ast_node_get_type(node: uintptr_t) -> i32;

    fn isl_set_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_map_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_union_set_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_union_map_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_schedule_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_schedule_node_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_pw_aff_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_multi_union_pw_aff_to_str(x: uintptr_t) -> *mut c_char;
    fn isl_val_to_str(x: uintptr_t) -> *mut c_char;

    fn isl_schedule_get_ctx(x: uintptr_t) -> uintptr_t;
    fn isl_printer_to_str(ctx: uintptr_t) -> uintptr_t;
    fn isl_printer_set_yaml_style(p: uintptr_t, style: i32) -> uintptr_t;
    fn isl_printer_print_schedule(p: uintptr_t, schedule: uintptr_t) -> uintptr_t;
    fn isl_printer_get_str(p: uintptr_t) -> *mut c_char;
    fn isl_printer_free(p: uintptr_t) -> uintptr_t;

    fn isl_version() -> *const c_char;
    fn isl_ctx_set_max_operations(ctx: uintptr_t, max_operations: libc::c_ulong);
}

thread_local! {
    /// The abort handle of the compilation running on this thread.
    static CURRENT_ABORT: RefCell<Option<Arc<Abort>>> = const { RefCell::new(None) };
}

/// Stops the isl work of one compilation from another thread.
///
/// isl cannot be interrupted from outside except through what its context
/// checks at every simplex pivot and allocation: the abort flag and the
/// operation quota (see `stop`). A compilation's thread installs an
/// `Abort` ([`Abort::install`]); every `Isl` context that thread creates
/// registers with it and leaves it when dropped. [`Abort::abort`] stops
/// each live context and every context created afterwards, so the
/// compilation ends with an isl error soon after (used when isl's scheduler
/// does not finish in time: see `pipeline::watch`).
#[derive(Default)]
pub struct Abort {
    state: Mutex<AbortState>,
}

#[derive(Default)]
struct AbortState {
    aborted: bool,
    /// The live contexts, by address.
    contexts: Vec<uintptr_t>,
}

impl Abort {
    /// Makes this handle apply to the contexts the current thread creates
    /// from now on.
    pub fn install(self: &Arc<Abort>) {
        CURRENT_ABORT.with(|a| *a.borrow_mut() = Some(Arc::clone(self)));
    }

    /// Stops every context registered now or later.
    pub fn abort(&self) {
        let mut s = self.lock();
        s.aborted = true;
        for &ctx in &s.contexts {
            // SAFETY: a registered context is live: its owner unregisters
            // it, under this lock, before freeing it.
            unsafe { stop(ctx) };
        }
    }

    fn register(&self, ctx: uintptr_t) {
        let mut s = self.lock();
        if s.aborted {
            // SAFETY: `ctx` was just allocated by the calling thread.
            unsafe { stop(ctx) };
        }
        s.contexts.push(ctx);
    }

    pub(super) fn unregister(&self, ctx: uintptr_t) {
        self.lock().contexts.retain(|&c| c != ctx);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AbortState> {
        // A panic while holding the lock leaves a consistent list.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Makes the next operation of the context at `ctx` fail: its operation
/// quota becomes 1, which every context has passed, so isl's next simplex
/// pivot or allocation fails with `isl_error_quota` and the message
/// "maximal number of operations exceeded". (`isl_ctx_abort` is the
/// natural call, but its error has no message, and isl-rs then reads a
/// null message and crashes.) isl stores one `unsigned long`, which the
/// owner's thread reads at its next operation.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn stop(ctx: uintptr_t) {
    // SAFETY: the caller's contract.
    unsafe { isl_ctx_set_max_operations(ctx, 1) }
}

/// Registers the context at `ctx`, just created by this thread, with the
/// abort handle this thread installed, and returns that handle (the
/// context's owner unregisters it before freeing it).
pub(super) fn register_with_current_abort(ctx: uintptr_t) -> Option<Arc<Abort>> {
    let abort = CURRENT_ABORT.with(|a| a.borrow().clone());
    if let Some(a) = &abort {
        a.register(ctx);
    }
    abort
}

/// Takes ownership of a string isl allocated and frees it.
fn take_isl_string(p: *mut c_char) -> String {
    if p.is_null() {
        return String::from("<isl error>");
    }
    // SAFETY: isl returns a NUL-terminated string allocated with malloc,
    // which the caller owns and must free.
    unsafe {
        let s = CStr::from_ptr(p).to_string_lossy().into_owned();
        libc::free(p as *mut libc::c_void);
        s
    }
}

/// `ISL_YAML_STYLE_BLOCK` of isl's `printer.h`.
const YAML_STYLE_BLOCK: i32 = 0;

/// `schedule` as isl's block-style YAML, one key a line (the form
/// `isl_schedule_read_from_str` also reads): [`IslPrint::text`] gives the
/// flow style, one line for the whole tree, which is hard to read for a
/// tree of more than a few nodes (the stage dumps of `pipeline::dump`).
pub fn schedule_yaml(schedule: &Schedule) -> String {
    // SAFETY: `schedule.ptr` is a live isl schedule owned by the caller;
    // the printer is created, used and freed here, and isl_printer_get_str
    // returns a string the caller owns (freed by take_isl_string). Each
    // printer function takes and gives back the printer (NULL after an
    // error, which the next call and isl_printer_free accept).
    unsafe {
        let p = isl_printer_to_str(isl_schedule_get_ctx(schedule.ptr));
        let p = isl_printer_set_yaml_style(p, YAML_STYLE_BLOCK);
        let p = isl_printer_print_schedule(p, schedule.ptr);
        let text = if p == 0 {
            String::from("<isl error>")
        } else {
            take_isl_string(isl_printer_get_str(p))
        };
        isl_printer_free(p);
        text
    }
}

/// isl's version string, which names its integer type (for example
/// `isl-0.27-IMath-32`): polyfuse is built with IMath's 32-bit small
/// integers (see `vendor/isl-rs/build.rs`).
pub fn version() -> String {
    // SAFETY: isl_version returns a pointer to a static NUL-terminated
    // string, never freed.
    unsafe { CStr::from_ptr(isl_version()).to_string_lossy().into_owned() }
}

/// isl's text form of an object, without leaking it.
pub trait IslPrint {
    fn text(&self) -> String;
}

macro_rules! isl_print {
    ($ty:ty, $f:ident) => {
        impl IslPrint for $ty {
            fn text(&self) -> String {
                // SAFETY: `ptr` is a live isl object owned by `self`; the
                // function only reads it.
                take_isl_string(unsafe { $f(self.ptr) })
            }
        }
    };
}

isl_print!(Set, isl_set_to_str);
isl_print!(isl_rs::Map, isl_map_to_str);
isl_print!(isl_rs::UnionSet, isl_union_set_to_str);
isl_print!(isl_rs::UnionMap, isl_union_map_to_str);
isl_print!(Schedule, isl_schedule_to_str);
isl_print!(isl_rs::ScheduleNode, isl_schedule_node_to_str);
isl_print!(PwAff, isl_pw_aff_to_str);
isl_print!(isl_rs::MultiUnionPwAff, isl_multi_union_pw_aff_to_str);
isl_print!(isl_rs::Val, isl_val_to_str);

/// Keeps the AST's loop iterators equal to the schedule's values: isl
/// otherwise divides a loop whose values share a stride by it (a block
/// loop over `16 n` becomes a loop over `n`), while the gpu stage's plans
/// (a register tile's element, a shared tile's offset) are functions of
/// the schedule's values.
pub fn keep_strides_unscaled(ctx: &isl_rs::Context) {
    // SAFETY: `ctx` is a live context; the call only sets an option.
    unsafe {
        isl_options_set_ast_build_scale_strides(ctx.ptr, 0);
    }
}

/// Builds the isl AST of `schedule` under the parameter `context`.
/// Returns `None` when isl fails.
pub fn ast_build_node_from_schedule(context: Set, schedule: Schedule) -> Option<ASTNode> {
    let mut context = context;
    let mut schedule = schedule;
    context.do_not_free_on_drop();
    schedule.do_not_free_on_drop();
    // SAFETY: both arguments are owned values whose ownership passes to
    // isl (`__isl_take`); the build is freed before returning.
    unsafe {
        let build = isl_ast_build_from_context(context.ptr);
        if build == 0 {
            isl_rs_free_schedule(schedule);
            return None;
        }
        let node = isl_ast_build_node_from_schedule(build, schedule.ptr);
        isl_ast_build_free(build);
        if node == 0 {
            return None;
        }
        Some(ASTNode {
            ptr: node,
            should_free_on_drop: true,
        })
    }
}

/// An AST expression for `pa` under the parameter `context` (used to print
/// inferred shapes and bounds as C).
pub fn ast_build_expr_from_pw_aff(context: Set, pa: PwAff) -> Option<ASTExpr> {
    let mut pa = pa;
    pa.do_not_free_on_drop();
    let free = |ptr| {
        drop(PwAff {
            ptr,
            should_free_on_drop: true,
        })
    };
    // SAFETY: `pa` is an owned value whose ownership passes to isl.
    unsafe { expr_from_context(context, pa.ptr, free, isl_ast_build_expr_from_pw_aff) }
}

/// `build_expr(build, arg)` on an AST build made from the parameter
/// `context`, freeing the build after; `arg` is taken (freed with `free`
/// when no build can be made).
///
/// # Safety
/// `arg` must be an owned isl object that nothing else frees, of the type
/// `build_expr` takes (`__isl_take`).
unsafe fn expr_from_context(
    context: Set,
    arg: uintptr_t,
    free: impl FnOnce(uintptr_t),
    build_expr: unsafe extern "C" fn(uintptr_t, uintptr_t) -> uintptr_t,
) -> Option<ASTExpr> {
    let mut context = context;
    context.do_not_free_on_drop();
    // SAFETY: the context's ownership passes to isl (`__isl_take`); the
    // caller guarantees `arg`; the build is freed before returning.
    unsafe {
        let build = isl_ast_build_from_context(context.ptr);
        if build == 0 {
            free(arg);
            return None;
        }
        let e = build_expr(build, arg);
        isl_ast_build_free(build);
        if e == 0 {
            return None;
        }
        Some(ASTExpr {
            ptr: e,
            should_free_on_drop: true,
        })
    }
}

/// The type of an AST node. isl-rs's own `get_type` numbers the node types
/// from 0 where isl numbers them from 1 (`isl_ast_node_for = 1`), so it is
/// read here directly.
pub fn ast_node_type(node: &ASTNode) -> isl_rs::ASTNodeType {
    // SAFETY: `node.ptr` is a live AST node owned by `node`; read only.
    match unsafe { isl_ast_node_get_type(node.ptr) } {
        1 => isl_rs::ASTNodeType::For,
        2 => isl_rs::ASTNodeType::If,
        3 => isl_rs::ASTNodeType::Block,
        4 => isl_rs::ASTNodeType::Mark,
        5 => isl_rs::ASTNodeType::User,
        _ => isl_rs::ASTNodeType::Error,
    }
}

/// A boolean AST expression that holds exactly on the parameter values of
/// the parameter set `set`, under the parameter `context`. Returns `None`
/// when isl fails.
pub fn ast_build_expr_from_set(context: Set, set: Set) -> Option<ASTExpr> {
    let mut set = set;
    set.do_not_free_on_drop();
    let free = |ptr| {
        drop(Set {
            ptr,
            should_free_on_drop: true,
        })
    };
    // SAFETY: `set` is an owned value whose ownership passes to isl.
    unsafe { expr_from_context(context, set.ptr, free, isl_ast_build_expr_from_set) }
}

fn isl_rs_free_schedule(s: Schedule) {
    drop(Schedule {
        ptr: s.ptr,
        should_free_on_drop: true,
    });
}
