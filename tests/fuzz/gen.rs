//! A generator of random valid polyfuse programs (spec/program-format.md).
//!
//! Every program is built with concrete parameter values in hand, and each
//! candidate statement is checked by simulating what the spec asks of it:
//! TC range inference (explicit `where` ranges, then rounds over the
//! accesses whose subscript has one unresolved index, as `model/ranges.rs`
//! does), then an enumeration of the iteration domain that checks every
//! access is in bounds, every read of a temp or output element and every
//! reduction without `!` meets an element an earlier statement wrote, and
//! that an output is written in full. A candidate that fails is dropped
//! and another drawn, so what comes out is valid by construction.
//!
//! Numerics are kept tame: inputs are uniform in [-1, 1), each expression
//! carries a bound on its magnitude (exp only of small arguments, division
//! only by `c + abs(..)`, `*=!` only of factors near 1 over short ranges),
//! and values rounded to f16 (f16 temps, `f16(..)` casts) reach only f16
//! outputs and never a reduction, since `--check` compares with an f64
//! reference at the output dtype's bound.

use super::rng::Rng;

/// An affine extent: `mul * param + add`, or the constant `add`.
#[derive(Clone, Debug)]
pub struct Ext {
    pub param: Option<usize>,
    pub mul: i64,
    pub add: i64,
}

#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub value: i64,
    pub symbolic: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Role {
    Input,
    Output,
    Temp,
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: &'static str,
    pub role: Role,
    /// The extents written in the file (None: a temp whose shape is
    /// inferred).
    pub shape_ext: Option<Vec<Ext>>,
    /// Whether a temp is listed under `temps` (with or without a shape).
    pub listed: bool,
    // Generator state.
    shape: Option<Vec<i64>>,
    written: Vec<bool>,
    bound: f64,
    lowp: bool,
}

/// A generated program: its parts (for mutations) and its text.
#[derive(Clone, Debug)]
pub struct Program {
    pub name: String,
    pub params: Vec<Param>,
    pub tensors: Vec<Tensor>,
    pub body: Vec<String>,
    /// `Some((a, b, r))`: the statements `body[a..b]` are written inside a
    /// loop block `{"for": "zb in 0:r", ...}`, so they run `r` times in
    /// order (the index `zb` unused): the same program repeated, which
    /// exercises loop blocks in every stage. Indices past the end of a
    /// mutated body are clamped.
    pub block: Option<(usize, usize, i64)>,
}

impl Ext {
    fn lit(v: i64) -> Ext {
        Ext {
            param: None,
            mul: 0,
            add: v,
        }
    }
    pub fn eval(&self, ps: &[Param]) -> i64 {
        match self.param {
            Some(p) => self.mul * ps[p].value + self.add,
            None => self.add,
        }
    }
    pub fn text(&self, ps: &[Param]) -> String {
        match self.param {
            None => self.add.to_string(),
            Some(p) => {
                let mut s = if self.mul == 1 {
                    ps[p].name.clone()
                } else {
                    format!("{}*{}", self.mul, ps[p].name)
                };
                if self.add > 0 {
                    s += &format!("+{}", self.add);
                } else if self.add < 0 {
                    s += &format!("-{}", -self.add);
                }
                s
            }
        }
    }
    fn plus(&self, c: i64) -> Ext {
        Ext {
            add: self.add + c,
            ..self.clone()
        }
    }
    fn times(&self, k: i64) -> Ext {
        Ext {
            param: self.param,
            mul: self.mul * k,
            add: self.add * k,
        }
    }
}

impl Program {
    /// The JSON text. Shape entries that are plain integers are written as
    /// numbers.
    pub fn json(&self) -> String {
        let mut s = String::new();
        s += &format!("{{\n  \"name\": \"{}\",\n  \"params\": {{", self.name);
        let ps: Vec<String> = self
            .params
            .iter()
            .map(|p| {
                if p.symbolic {
                    format!("\"{}\": null", p.name)
                } else {
                    format!("\"{}\": {}", p.name, p.value)
                }
            })
            .collect();
        s += &ps.join(", ");
        s += "},\n";
        for (key, role) in [
            ("inputs", Role::Input),
            ("outputs", Role::Output),
            ("temps", Role::Temp),
        ] {
            let ts: Vec<String> = self
                .tensors
                .iter()
                .filter(|t| t.role == role && (role != Role::Temp || t.listed))
                .map(|t| match &t.shape_ext {
                    Some(sh) => {
                        let dims: Vec<String> = sh
                            .iter()
                            .map(|e| match e.param {
                                None => e.add.to_string(),
                                Some(_) => format!("\"{}\"", e.text(&self.params)),
                            })
                            .collect();
                        format!(
                            "    \"{}\": {{\"dtype\": \"{}\", \"shape\": [{}]}}",
                            t.name,
                            t.dtype,
                            dims.join(", ")
                        )
                    }
                    None => format!("    \"{}\": {{\"dtype\": \"{}\"}}", t.name, t.dtype),
                })
                .collect();
            if role == Role::Temp && ts.is_empty() {
                continue;
            }
            s += &format!("  \"{key}\": {{\n{}\n  }},\n", ts.join(",\n"));
        }
        let quoted = |b: &String| format!("\"{b}\"");
        let body: Vec<String> = match self.block {
            Some((a, b, reps)) if a < b.min(self.body.len()) => {
                let b = b.min(self.body.len());
                let mut v: Vec<String> = self.body[..a].iter().map(quoted).collect();
                let inner: Vec<String> = self.body[a..b].iter().map(quoted).collect();
                v.push(format!(
                    "{{\"for\": \"zb in 0:{reps}\", \"body\": [{}]}}",
                    inner.join(", ")
                ));
                v.extend(self.body[b..].iter().map(quoted));
                v
            }
            _ => self.body.iter().map(quoted).collect(),
        };
        let body: Vec<String> = body.iter().map(|b| format!("    {b}")).collect();
        s += &format!("  \"body\": [\n{}\n  ]\n}}\n", body.join(",\n"));
        s
    }

    /// `--param NAME=V` for every symbolic parameter.
    pub fn param_args(&self) -> Vec<String> {
        self.params
            .iter()
            .filter(|p| p.symbolic)
            .flat_map(|p| ["--param".to_string(), format!("{}={}", p.name, p.value)])
            .collect()
    }

    pub fn has_symbolic(&self) -> bool {
        self.params.iter().any(|p| p.symbolic)
    }
}

/// An affine subscript or constraint side: concrete terms and text.
#[derive(Clone, Debug)]
struct Aff {
    terms: Vec<(usize, i64)>,
    cst: i64,
    text: String,
}

impl Aff {
    fn var(v: usize, name: &str) -> Aff {
        Aff {
            terms: vec![(v, 1)],
            cst: 0,
            text: name.to_string(),
        }
    }
    fn cst(c: i64) -> Aff {
        Aff {
            terms: vec![],
            cst: c,
            text: c.to_string(),
        }
    }
    fn eval(&self, pt: &[i64]) -> i64 {
        self.cst + self.terms.iter().map(|(v, k)| k * pt[*v]).sum::<i64>()
    }
}

#[derive(Clone, Debug)]
struct Var {
    name: String,
    /// Intended range `[lo, hi)`; `hi` as an extent for new inputs.
    lo: i64,
    hi: Ext,
    /// Written as `where x in lo:hi`.
    explicit: bool,
}

#[derive(Clone, Debug)]
struct Read {
    tensor: usize,
    subs: Vec<Aff>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rel {
    Le,
    Lt,
    Ge,
    Gt,
}

#[derive(Clone, Debug)]
struct Constraint {
    a: Aff,
    rel: Rel,
    b: Aff,
}

/// A `where` condition: a union of conjunctions of comparisons (a
/// single comparison is written plainly, several alternatives as
/// `(a && b) || c`, the spec's disjunctive `where`).
#[derive(Clone, Debug)]
struct Cond(Vec<Vec<Constraint>>);

impl Cond {
    fn one(c: Constraint) -> Cond {
        Cond(vec![vec![c]])
    }
    fn holds(&self, pt: &[i64]) -> bool {
        self.0.iter().any(|conj| conj.iter().all(|c| c.holds(pt)))
    }
    fn text(&self) -> String {
        if let [conj] = self.0.as_slice() {
            let parts: Vec<String> = conj.iter().map(|c| c.text()).collect();
            return parts.join(", ");
        }
        let alts: Vec<String> = self
            .0
            .iter()
            .map(|conj| {
                let parts: Vec<String> = conj.iter().map(|c| c.text()).collect();
                format!("({})", parts.join(" && "))
            })
            .collect();
        alts.join(" || ")
    }
}

impl Constraint {
    fn holds(&self, pt: &[i64]) -> bool {
        let (x, y) = (self.a.eval(pt), self.b.eval(pt));
        match self.rel {
            Rel::Le => x <= y,
            Rel::Lt => x < y,
            Rel::Ge => x >= y,
            Rel::Gt => x > y,
        }
    }
    fn text(&self) -> String {
        let r = match self.rel {
            Rel::Le => "<=",
            Rel::Lt => "<",
            Rel::Ge => ">=",
            Rel::Gt => ">",
        };
        format!("{} {r} {}", self.a.text, self.b.text)
    }
    fn negated(&self) -> Constraint {
        let rel = match self.rel {
            Rel::Le => Rel::Gt,
            Rel::Lt => Rel::Ge,
            Rel::Ge => Rel::Lt,
            Rel::Gt => Rel::Le,
        };
        Constraint {
            rel,
            ..self.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Assign,
    Sum,
    Prod,
    Max,
    Min,
}

/// A statement under construction.
#[derive(Clone, Debug)]
struct Stmt {
    lhs: usize,
    /// The first `nlhs` vars are the left side's.
    nlhs: usize,
    vars: Vec<Var>,
    op: Op,
    bang: bool,
    rhs: String,
    bound: f64,
    lowp: bool,
    reads: Vec<Read>,
    constraints: Vec<Cond>,
}

const VAR_NAMES: [&str; 10] = ["i", "j", "k", "l", "m", "n", "p", "q", "r", "s"];
const PARAM_NAMES: [&str; 5] = ["N", "M", "K", "L", "S"];
/// Largest iteration domain of one statement.
const MAX_POINTS: i64 = 150_000;
/// Largest magnitude a stored value may reach.
const MAX_BOUND: f64 = 2e4;

pub struct Gen {
    rng: Rng,
    p: Program,
    ninputs: usize,
    ntemps: usize,
    noutputs: usize,
    /// The intended extents of a temp whose shape is left to inference.
    pending_shape: Option<Vec<Ext>>,
}

/// A generated program with a description of what it exercises.
pub fn generate(seed: u64) -> Program {
    let mut attempt = 0u64;
    loop {
        let mut g = Gen::new(seed.wrapping_mul(1_000_003).wrapping_add(attempt));
        if let Some(mut p) = g.program() {
            // One program in five has some of its statements in a loop
            // block, chosen by a generator of its own so that the rest
            // of the program is what the seed always made.
            let mut r = Rng::new(seed ^ 0x6c6f_6f70_626c_6b73);
            if r.chance(0.2) {
                let n = p.body.len();
                let a = r.below(n);
                let b = a + 1 + r.below(n - a);
                p.block = Some((a, b, r.range(1, 3)));
            }
            return p;
        }
        attempt += 1;
    }
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            p: Program {
                name: format!("fz{seed:x}").chars().take(12).collect(),
                params: vec![],
                tensors: vec![],
                body: vec![],
                block: None,
            },
            ninputs: 0,
            ntemps: 0,
            noutputs: 0,
            pending_shape: None,
        }
    }

    fn program(&mut self) -> Option<Program> {
        let np = self.rng.range(1, 3) as usize;
        for name in PARAM_NAMES.iter().take(np) {
            let value = if self.rng.chance(0.15) {
                self.rng.range(33, 70)
            } else if self.rng.chance(0.1) {
                self.rng.range(1, 3)
            } else {
                self.rng.range(2, 24)
            };
            self.p.params.push(Param {
                name: name.to_string(),
                value,
                symbolic: self.rng.chance(0.3),
            });
        }
        let target = self.rng.range(1, 8) as usize;
        let mut tries = 0;
        while self.p.body.len() < target && tries < 60 {
            tries += 1;
            let room = target - self.p.body.len();
            let saved = (self.p.clone(), self.ninputs, self.ntemps, self.noutputs);
            if !self.group(room) {
                (self.p, self.ninputs, self.ntemps, self.noutputs) = saved;
            }
        }
        let mut tries = 0;
        while self.noutputs == 0 {
            tries += 1;
            if tries > 40 {
                return None;
            }
            let saved = (self.p.clone(), self.ninputs, self.ntemps, self.noutputs);
            if self.fresh(true, false).is_none() {
                (self.p, self.ninputs, self.ntemps, self.noutputs) = saved;
            }
        }
        Some(self.p.clone())
    }

    // ----- tensors and extents -----

    fn random_ext(&mut self) -> Ext {
        if self.rng.chance(0.2) {
            return Ext::lit(self.rng.range(1, 9));
        }
        let p = self.rng.below(self.p.params.len());
        let v = self.p.params[p].value;
        let mul = if v <= 12 && self.rng.chance(0.1) {
            2
        } else {
            1
        };
        let add = match self.rng.below(6) {
            0 => self.rng.range(1, 3),
            1 if mul * v > 2 => -self.rng.range(1, (mul * v - 1).min(2)),
            _ => 0,
        };
        Ext {
            param: Some(p),
            mul,
            add,
        }
    }

    fn add_tensor(&mut self, role: Role, dtype: &'static str, shape: Option<Vec<Ext>>) -> usize {
        let name = match role {
            Role::Input => {
                self.ninputs += 1;
                format!("X{}", self.ninputs)
            }
            Role::Output => {
                self.noutputs += 1;
                format!("Y{}", self.noutputs)
            }
            Role::Temp => {
                self.ntemps += 1;
                format!("T{}", self.ntemps)
            }
        };
        let conc: Option<Vec<i64>> = shape
            .as_ref()
            .map(|s| s.iter().map(|e| e.eval(&self.p.params)).collect());
        let n = conc
            .as_ref()
            .map_or(0, |c| c.iter().product::<i64>() as usize);
        self.p.tensors.push(Tensor {
            name,
            dtype,
            role,
            shape_ext: shape,
            listed: true,
            shape: conc,
            written: vec![role == Role::Input; n],
            bound: 1.0,
            lowp: false,
        });
        self.p.tensors.len() - 1
    }

    // ----- groups of statements -----

    /// One group: a fresh write of a new tensor (one statement or two
    /// complementary ones), or an update of a tensor written in full.
    fn group(&mut self, room: usize) -> bool {
        let updatable: Vec<usize> = (0..self.p.tensors.len())
            .filter(|&t| {
                let t = &self.p.tensors[t];
                t.role != Role::Input && !t.written.is_empty() && t.written.iter().all(|w| *w)
            })
            .collect();
        let c = self.rng.below(10);
        if c < 2 && !updatable.is_empty() {
            let t = *self.rng.pick(&updatable);
            return self.update(t);
        }
        let output = self.noutputs < 3 && (self.noutputs == 0 || self.rng.chance(0.4));
        let split = room >= 2 && self.rng.chance(0.25);
        self.fresh(output, split).is_some()
    }

    fn new_target(&mut self, output: bool) -> usize {
        let rank = *self.rng.pick(&[0usize, 1, 1, 2, 2, 2, 2, 3, 3]);
        let dtype = if self.rng.chance(0.3) { "f16" } else { "f32" };
        if output {
            let shape: Vec<Ext> = (0..rank).map(|_| self.random_ext()).collect();
            self.add_tensor(Role::Output, dtype, Some(shape))
        } else {
            let declared_shape = self.rng.chance(0.5);
            let shape: Vec<Ext> = (0..rank).map(|_| self.random_ext()).collect();
            let t = self.add_tensor(Role::Temp, dtype, Some(shape.clone()));
            if !declared_shape {
                // Shape inferred from the first statement that writes it;
                // the extents drawn become the intended ranges.
                let tt = &mut self.p.tensors[t];
                tt.shape = None;
                tt.written = vec![];
                tt.shape_ext = None;
                tt.listed = self.rng.chance(0.4);
                if !tt.listed {
                    tt.dtype = "f32";
                }
                self.pending_shape = Some(shape);
            }
            t
        }
    }

    fn fresh(&mut self, output: bool, split: bool) -> Option<()> {
        self.pending_shape = None;
        let t = self.new_target(output);
        let shape = match &self.p.tensors[t].shape_ext {
            Some(s) => s.clone(),
            None => self.pending_shape.clone().unwrap(),
        };
        let declared = self.p.tensors[t].shape_ext.is_some();
        let rank = shape.len();
        // The left side's vars.
        let mut vars: Vec<Var> = (0..rank)
            .map(|d| Var {
                name: VAR_NAMES[d].to_string(),
                lo: 0,
                hi: shape[d].clone(),
                explicit: !declared && self.rng.chance(0.3) || self.rng.chance(0.08),
            })
            .collect();
        let ops = [
            Op::Assign,
            Op::Assign,
            Op::Sum,
            Op::Sum,
            Op::Prod,
            Op::Max,
            Op::Min,
        ];
        let op = *self.rng.pick(&ops);
        let mut stmts = vec![];
        if split {
            let vals: Vec<i64> = shape.iter().map(|e| e.eval(&self.p.params)).collect();
            let tri = rank >= 2 && self.rng.chance(0.6);
            if tri {
                // j <= i + c  and its complement.
                let c = if self.rng.chance(0.7) {
                    0
                } else {
                    self.rng.range(-2, 2)
                };
                let b = Aff {
                    terms: vec![(0, 1)],
                    cst: c,
                    text: match c {
                        0 => "i".into(),
                        c if c > 0 => format!("i + {c}"),
                        c => format!("i - {}", -c),
                    },
                };
                let k = Constraint {
                    a: Aff::var(1, "j"),
                    rel: *self.rng.pick(&[Rel::Le, Rel::Lt]),
                    b,
                };
                // `=` only: a `!` reduction's box would be the square.
                for k in [k.clone(), k.negated()] {
                    let mut s = self.stmt(t, vars.clone(), Op::Assign, true)?;
                    s.constraints.push(Cond::one(k));
                    stmts.push(s);
                }
            } else if rank >= 1 && vals[0] >= 2 {
                let cut = self.rng.range(1, vals[0] - 1);
                let mut v1 = vars.clone();
                v1[0].hi = Ext::lit(cut);
                v1[0].explicit = true;
                let mut v2 = vars.clone();
                v2[0].lo = cut;
                v2[0].explicit = true;
                let o2 = if self.rng.chance(0.5) {
                    op
                } else {
                    *self.rng.pick(&ops)
                };
                stmts.push(self.stmt(t, v1, op, true)?);
                stmts.push(self.stmt(t, v2, o2, true)?);
            } else {
                stmts.push(self.stmt(t, vars, op, true)?);
            }
        } else {
            if rank >= 1 && !declared && self.rng.chance(0.2) {
                vars[0].explicit = true;
            }
            stmts.push(self.stmt(t, vars, op, true)?);
        }
        for s in stmts {
            self.commit(s)?;
        }
        if output {
            let tt = &self.p.tensors[t];
            if !tt.written.iter().all(|w| *w) {
                return None;
            }
        }
        Some(())
    }

    /// A statement without `!` into a tensor written in full: `+=`, `*=`,
    /// `max=`, `min=`, or `=` that reads the element it writes.
    fn update(&mut self, t: usize) -> bool {
        let shape = self.p.tensors[t].shape.clone().unwrap();
        let exts: Vec<Ext> = match &self.p.tensors[t].shape_ext {
            Some(s) => s.clone(),
            None => shape.iter().map(|v| Ext::lit(*v)).collect(),
        };
        let vars: Vec<Var> = exts
            .iter()
            .enumerate()
            .map(|(d, e)| Var {
                name: VAR_NAMES[d].to_string(),
                lo: 0,
                hi: e.clone(),
                explicit: false,
            })
            .collect();
        let op = *self
            .rng
            .pick(&[Op::Assign, Op::Assign, Op::Sum, Op::Prod, Op::Max, Op::Min]);
        let Some(mut s) = self.stmt(t, vars, op, false) else {
            return false;
        };
        if self.rng.chance(0.2) && s.nlhs >= 2 {
            s.constraints.push(Cond::one(Constraint {
                a: Aff::var(1, "j"),
                rel: Rel::Le,
                b: Aff::var(0, "i"),
            }));
        }
        self.commit(s).is_some()
    }

    // ----- one statement -----

    /// Draws the right side of a statement writing `t` over `vars`.
    fn stmt(&mut self, t: usize, vars: Vec<Var>, op: Op, bang: bool) -> Option<Stmt> {
        let lhs_f16 = self.p.tensors[t].dtype == "f16";
        let lhs_out = self.p.tensors[t].role == Role::Output;
        let reducing = op != Op::Assign;
        let mut b = Builder {
            g: self,
            nlhs: vars.len(),
            vars,
            reads: vec![],
            lhs: t,
            max_red: if reducing { 2 } else { 0 },
            // Rounded values never feed a reduction or an f32 output.
            lowp_ok: !reducing && (lhs_f16 || !lhs_out),
            lowp: false,
        };
        let depth = b.g.rng.range(0, 3) as usize;
        let mut e = b.expr(depth);
        if b.reads.is_empty() {
            let r = b.read()?;
            e = E {
                text: format!("{} + {}", r.text, e.text),
                bound: r.bound + e.bound,
            };
        }
        if !bang && op == Op::Assign {
            // `=` into a written tensor reads its own element.
            let own = b.own_read();
            e = match b.g.rng.below(3) {
                0 => E {
                    text: format!("max({} + {}, 0)", own.text, e.text),
                    bound: own.bound + e.bound,
                },
                1 => E {
                    text: format!("{} * tanh({})", own.text, e.text),
                    bound: own.bound,
                },
                _ => E {
                    text: format!("0.5 * {} - ({})", own.text, e.text),
                    bound: own.bound + e.bound,
                },
            };
        }
        if op == Op::Prod {
            e = E {
                text: format!("(1 + 0.25 * tanh({}))", e.text),
                bound: 1.25,
            };
        }
        if e.bound > MAX_BOUND / 10.0 {
            e = E {
                text: format!("tanh({})", e.text),
                bound: 1.0,
            };
        }
        let constraints = b.constraints();
        let Builder {
            vars,
            reads,
            nlhs,
            lowp,
            ..
        } = b;
        Some(Stmt {
            lhs: t,
            nlhs,
            vars,
            op,
            bang,
            rhs: e.text,
            bound: e.bound,
            lowp,
            reads,
            constraints,
        })
    }

    /// TC range inference, concretely (model/ranges.rs).
    fn infer(&self, s: &Stmt) -> Option<Vec<(i64, i64)>> {
        let n = s.vars.len();
        let mut res: Vec<Option<(i64, i64)>> = vec![None; n];
        for (i, v) in s.vars.iter().enumerate() {
            if v.explicit {
                res[i] = Some((v.lo, v.hi.eval(&self.p.params)));
            }
        }
        let mut accesses: Vec<(Vec<i64>, Vec<Aff>)> = vec![];
        if let Some(sh) = &self.p.tensors[s.lhs].shape {
            let subs = (0..s.nlhs).map(|i| Aff::var(i, &s.vars[i].name)).collect();
            accesses.push((sh.clone(), subs));
        }
        for r in &s.reads {
            accesses.push((self.p.tensors[r.tensor].shape.clone()?, r.subs.clone()));
        }
        loop {
            let mut round: Vec<Option<(i64, i64)>> = vec![None; n];
            let mut any = false;
            for (shape, subs) in &accesses {
                for (d, e) in subs.iter().enumerate() {
                    let un: Vec<&(usize, i64)> =
                        e.terms.iter().filter(|(v, _)| res[*v].is_none()).collect();
                    if un.len() != 1 || d >= shape.len() {
                        continue;
                    }
                    let (x, a) = *un[0];
                    let (mut mn, mut mx) = (e.cst, e.cst);
                    for (v, k) in &e.terms {
                        if *v == x {
                            continue;
                        }
                        let (lo, hi) = res[*v].unwrap();
                        if lo >= hi {
                            return None; // empty: isl's answer is unbounded
                        }
                        let (p, q) = (k * lo, k * (hi - 1));
                        mn += p.min(q);
                        mx += p.max(q);
                    }
                    let ext = shape[d];
                    // 0 <= a x + mn  and  a x + mx <= ext - 1
                    let (lo, hi) = if a > 0 {
                        (div_ceil(-mn, a), div_floor(ext - 1 - mx, a) + 1)
                    } else {
                        let a = -a;
                        (div_ceil(mx - ext + 1, a), div_floor(mn, a) + 1)
                    };
                    round[x] = Some(match round[x] {
                        Some((l, h)) => (l.max(lo), h.min(hi)),
                        None => (lo, hi),
                    });
                    any = true;
                }
            }
            if !any {
                break;
            }
            for i in 0..n {
                if let Some(r) = round[i] {
                    res[i] = Some(r);
                }
            }
        }
        res.into_iter().map(|r| r.filter(|(l, h)| l < h)).collect()
    }

    /// Checks a statement against the spec's rules and records what it
    /// writes; `None` when it breaks one (nothing is recorded then).
    fn commit(&mut self, mut s: Stmt) -> Option<()> {
        let mut ranges = self.infer(&s);
        if ranges.is_none() {
            // An index no subscript determines: state its range.
            for v in s.vars.iter_mut() {
                v.explicit = true;
            }
            ranges = self.infer(&s);
        }
        let ranges = ranges?;
        let ps = self.p.params.clone();
        let points: i64 = ranges.iter().map(|(l, h)| h - l).product();
        if points > MAX_POINTS {
            return None;
        }
        // The left side's shape: declared, known, or inferred now.
        let lhs_shape: Vec<i64> = match &self.p.tensors[s.lhs].shape {
            Some(sh) => sh.clone(),
            None => {
                if ranges[..s.nlhs].iter().any(|(l, _)| *l < 0) {
                    return None;
                }
                ranges[..s.nlhs].iter().map(|(_, h)| *h).collect()
            }
        };
        if lhs_shape.iter().product::<i64>() > 40_000 {
            return None;
        }
        let flat = |shape: &[i64], idx: &[i64]| -> Option<usize> {
            let mut f = 0i64;
            for (e, i) in shape.iter().zip(idx) {
                if *i < 0 || i >= e {
                    return None;
                }
                f = f * e + i;
            }
            Some(f as usize)
        };
        let lhs_n = lhs_shape.iter().product::<i64>() as usize;
        let old_written = if self.p.tensors[s.lhs].shape.is_some() {
            self.p.tensors[s.lhs].written.clone()
        } else {
            vec![false; lhs_n]
        };
        let mut count = vec![0u32; lhs_n];
        let mut pt: Vec<i64> = ranges.iter().map(|(l, _)| *l).collect();
        let n = pt.len();
        let mut any_point = false;
        'outer: loop {
            if s.constraints.iter().all(|c| c.holds(&pt)) {
                any_point = true;
                let li: Vec<i64> = pt[..s.nlhs].to_vec();
                let f = flat(&lhs_shape, &li)?;
                if !s.bang && !old_written[f] {
                    return None;
                }
                count[f] += 1;
                for r in &s.reads {
                    let t = &self.p.tensors[r.tensor];
                    let idx: Vec<i64> = r.subs.iter().map(|a| a.eval(&pt)).collect();
                    let f = flat(t.shape.as_ref()?, &idx)?;
                    if r.tensor == s.lhs {
                        if !old_written[f] {
                            return None;
                        }
                    } else if !t.written[f] {
                        return None;
                    }
                }
            }
            let mut d = n;
            loop {
                if d == 0 {
                    break 'outer;
                }
                d -= 1;
                pt[d] += 1;
                if pt[d] < ranges[d].1 {
                    break;
                }
                pt[d] = ranges[d].0;
            }
            if n == 0 {
                break;
            }
        }
        if !any_point {
            return None;
        }
        // A `!` reduction must meet every element of its left side's box
        // (whether the identity is stored over the box or the domain's
        // projection is then the same).
        if s.bang && s.op != Op::Assign {
            let mut li = vec![0i64; s.nlhs];
            let boxn: i64 = ranges[..s.nlhs].iter().map(|(l, h)| h - l).product();
            for b in 0..boxn {
                let mut rem = b;
                for d in (0..s.nlhs).rev() {
                    let w = ranges[d].1 - ranges[d].0;
                    li[d] = ranges[d].0 + rem % w;
                    rem /= w;
                }
                let f = flat(&lhs_shape, &li)?;
                if count[f] == 0 {
                    return None;
                }
            }
        }
        let maxcount = *count.iter().max().unwrap_or(&0) as f64;
        let old_bound = self.p.tensors[s.lhs].bound;
        let bound = match s.op {
            Op::Assign => s.bound,
            Op::Sum => s.bound * maxcount + if s.bang { 0.0 } else { old_bound },
            Op::Prod => {
                if maxcount > 10.0 {
                    return None;
                }
                s.bound.powf(maxcount) * if s.bang { 1.0 } else { old_bound }
            }
            Op::Max | Op::Min => s.bound.max(if s.bang { 0.0 } else { old_bound }),
        };
        if bound > MAX_BOUND {
            return None;
        }
        // Record.
        let text = self.text(&s, &ranges, &ps);
        let t = &mut self.p.tensors[s.lhs];
        if t.shape.is_none() {
            t.shape = Some(lhs_shape);
            t.written = vec![false; lhs_n];
            t.bound = 0.0;
        }
        for (f, c) in count.iter().enumerate() {
            if *c > 0 {
                t.written[f] = true;
            }
        }
        t.bound = t.bound.max(bound);
        t.lowp |= s.lowp || t.dtype == "f16";
        self.p.body.push(text);
        Some(())
    }

    fn text(&self, s: &Stmt, _ranges: &[(i64, i64)], ps: &[Param]) -> String {
        let lhs: Vec<&str> = s.vars[..s.nlhs].iter().map(|v| v.name.as_str()).collect();
        let op = match s.op {
            Op::Assign => "=",
            Op::Sum => "+=",
            Op::Prod => "*=",
            Op::Max => "max=",
            Op::Min => "min=",
        };
        let bang = if s.bang && s.op != Op::Assign {
            "!"
        } else {
            ""
        };
        let mut out = format!(
            "{}({}) {op}{bang} {}",
            self.p.tensors[s.lhs].name,
            lhs.join(", "),
            s.rhs
        );
        let mut clauses: Vec<String> = s
            .vars
            .iter()
            .filter(|v| v.explicit)
            .map(|v| format!("{} in {}:{}", v.name, v.lo, v.hi.text(ps)))
            .collect();
        clauses.extend(s.constraints.iter().map(|c| c.text()));
        if !clauses.is_empty() {
            out += " where ";
            out += &clauses.join(", ");
        }
        out
    }
}

fn div_floor(a: i64, b: i64) -> i64 {
    let q = a / b;
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn div_ceil(a: i64, b: i64) -> i64 {
    -div_floor(-a, b)
}

/// An expression: its text and a bound on its magnitude.
struct E {
    text: String,
    bound: f64,
}

struct Builder<'a> {
    g: &'a mut Gen,
    nlhs: usize,
    vars: Vec<Var>,
    reads: Vec<Read>,
    lhs: usize,
    max_red: usize,
    lowp_ok: bool,
    lowp: bool,
}

impl Builder<'_> {
    fn nred(&self) -> usize {
        self.vars.len() - self.nlhs
    }

    fn new_var(&mut self, lo: i64, hi: Ext, explicit: bool) -> usize {
        let name = VAR_NAMES[self.vars.len()].to_string();
        self.vars.push(Var {
            name,
            lo,
            hi,
            explicit,
        });
        self.vars.len() - 1
    }

    fn expr(&mut self, depth: usize) -> E {
        if depth == 0 || self.g.rng.chance(0.25) {
            return self.leaf();
        }
        let a = self.expr(depth - 1);
        let rng = &mut self.g.rng;
        match rng.below(19) {
            0 | 1 => {
                let b = self.expr(depth - 1);
                E {
                    text: format!("{} + {}", a.text, b.text),
                    bound: a.bound + b.bound,
                }
            }
            2 => {
                let b = self.expr(depth - 1);
                E {
                    text: format!("{} - ({})", a.text, b.text),
                    bound: a.bound + b.bound,
                }
            }
            3 | 4 => {
                let b = self.expr(depth - 1);
                if a.bound * b.bound > 1e3 {
                    E {
                        text: format!("tanh({}) * tanh({})", a.text, b.text),
                        bound: 1.0,
                    }
                } else {
                    E {
                        text: format!("({}) * ({})", a.text, b.text),
                        bound: a.bound * b.bound,
                    }
                }
            }
            5 => {
                let b = self.expr(depth - 1);
                E {
                    text: format!("({}) / (1.5 + abs({}))", a.text, b.text),
                    bound: a.bound / 1.5,
                }
            }
            6 => {
                if a.bound <= 3.0 {
                    E {
                        text: format!("exp({})", a.text),
                        bound: a.bound.exp(),
                    }
                } else {
                    E {
                        text: format!("exp(-abs({}))", a.text),
                        bound: 1.0,
                    }
                }
            }
            7 => E {
                text: format!("tanh({})", a.text),
                bound: 1.0,
            },
            8 => E {
                text: format!("sigmoid({})", a.text),
                bound: 1.0,
            },
            9 => E {
                text: format!("sqrt(abs({}) + 0.5)", a.text),
                bound: (a.bound + 0.5).sqrt(),
            },
            10 => E {
                text: format!("rsqrt(1 + abs({}))", a.text),
                bound: 1.0,
            },
            11 => E {
                text: format!("log(2 + abs({}))", a.text),
                bound: (2.0 + a.bound).ln(),
            },
            12 => {
                if a.bound < 30.0 {
                    E {
                        text: format!("pow(1 + abs({}), 2)", a.text),
                        bound: (1.0 + a.bound).powi(2),
                    }
                } else {
                    E {
                        text: format!("pow(1 + abs({}), 0.5)", a.text),
                        bound: (1.0 + a.bound).sqrt(),
                    }
                }
            }
            13 => {
                let b = self.expr(depth - 1);
                let f = if self.g.rng.chance(0.5) { "max" } else { "min" };
                E {
                    text: format!("{f}({}, {})", a.text, b.text),
                    bound: a.bound.max(b.bound),
                }
            }
            14 => E {
                text: format!("max({}, 0)", a.text),
                bound: a.bound,
            },
            15 => E {
                text: format!("-{}", paren(&a.text)),
                bound: a.bound,
            },
            16 => {
                if self.lowp_ok && a.bound < 1e4 && self.g.rng.chance(0.5) {
                    self.lowp = true;
                    E {
                        text: format!("f16({})", a.text),
                        bound: a.bound,
                    }
                } else {
                    E {
                        text: format!("f32({})", a.text),
                        bound: a.bound,
                    }
                }
            }
            17 => {
                let b = self.expr(depth - 1);
                let c = self.condition();
                E {
                    text: format!("({c} ? {} : {})", a.text, b.text),
                    bound: a.bound.max(b.bound),
                }
            }
            _ => E {
                text: format!("abs({})", a.text),
                bound: a.bound,
            },
        }
    }

    /// A condition on indices and parameters only (exact in every
    /// precision, so the check never meets a flipped branch).
    fn condition(&mut self) -> String {
        let n = self.vars.len();
        if n == 0 {
            let p = &self.g.p.params[self.g.rng.below(self.g.p.params.len())];
            return format!("{} > {}", p.name, self.g.rng.range(1, 20));
        }
        let x = self.vars[self.g.rng.below(n)].name.clone();
        match self.g.rng.below(3) {
            0 if n >= 2 => {
                let y = self.vars[self.g.rng.below(n)].name.clone();
                format!("{x} <= {y}")
            }
            1 => {
                let p = self.g.p.params[self.g.rng.below(self.g.p.params.len())]
                    .name
                    .clone();
                format!("2 * {x} < {p}")
            }
            _ => format!("{x} < {}", self.g.rng.range(1, 5)),
        }
    }

    fn leaf(&mut self) -> E {
        let c = self.g.rng.below(20);
        if c == 0 {
            let v = *self.g.rng.pick(&[0.5, 2.0, 1.5, 0.25, 3.0]);
            return E {
                text: format!("{v:?}"),
                bound: v,
            };
        }
        if c == 1 && !self.vars.is_empty() {
            let x = self.vars[self.g.rng.below(self.vars.len())].name.clone();
            return E {
                text: format!("0.01 * {x}"),
                bound: 2.0,
            };
        }
        if c == 2 {
            let p = self.g.p.params[self.g.rng.below(self.g.p.params.len())]
                .name
                .clone();
            return E {
                text: format!("(1 / f32({p}))"),
                bound: 1.0,
            };
        }
        match self.read() {
            Some(e) => e,
            None => E {
                text: "1.5".into(),
                bound: 1.5,
            },
        }
    }

    /// The left side's own element (an `=` that updates).
    fn own_read(&mut self) -> E {
        let t = &self.g.p.tensors[self.lhs];
        let subs: Vec<Aff> = (0..self.nlhs)
            .map(|i| Aff::var(i, &self.vars[i].name))
            .collect();
        let text = access_text(&t.name, &subs);
        let bound = t.bound;
        if t.lowp {
            self.lowp = true;
        }
        self.reads.push(Read {
            tensor: self.lhs,
            subs,
        });
        E { text, bound }
    }

    fn read(&mut self) -> Option<E> {
        let g = &self.g;
        let sources: Vec<usize> = (0..g.p.tensors.len())
            .filter(|&t| {
                let tt = &g.p.tensors[t];
                t != self.lhs
                    && tt.shape.is_some()
                    && tt.written.iter().any(|w| *w)
                    && (self.lowp_ok || !tt.lowp)
            })
            .collect();
        let c = self.g.rng.below(10);
        if c < 6 && !sources.is_empty() {
            let t = *self.g.rng.pick(&sources);
            if let Some(e) = self.read_of(t) {
                return Some(e);
            }
        }
        self.new_input_read()
    }

    /// A read of the existing tensor `t` whose subscripts fit its extents
    /// over the vars' intended ranges.
    fn read_of(&mut self, t: usize) -> Option<E> {
        let shape = self.g.p.tensors[t].shape.clone()?;
        let exts = self.g.p.tensors[t].shape_ext.clone();
        let mut subs = vec![];
        for (d, &ext) in shape.iter().enumerate() {
            let e = exts.as_ref().map(|x| x[d].clone());
            subs.push(self.fit(ext, e)?);
        }
        let tt = &self.g.p.tensors[t];
        let text = access_text(&tt.name, &subs);
        let bound = tt.bound;
        if tt.lowp {
            self.lowp = true;
        }
        self.reads.push(Read { tensor: t, subs });
        Some(E { text, bound })
    }

    fn fit(&mut self, ext: i64, ext_sym: Option<Ext>) -> Option<Aff> {
        let ps = self.g.p.params.clone();
        let mut options: Vec<Aff> = vec![];
        for (v, var) in self.vars.iter().enumerate() {
            let hi = var.hi.eval(&ps);
            if var.lo >= 0 && hi <= ext {
                options.push(Aff::var(v, &var.name));
                options.push(Aff::var(v, &var.name));
                if hi < ext {
                    let c = self.g.rng.range(1, ext - hi);
                    let c = c.min(3);
                    options.push(Aff {
                        terms: vec![(v, 1)],
                        cst: c,
                        text: format!("{} + {c}", var.name),
                    });
                }
                if var.lo == 0 && hi == ext {
                    if let Some(e) = &ext_sym {
                        options.push(Aff {
                            terms: vec![(v, -1)],
                            cst: ext - 1,
                            text: format!("{} - 1 - {}", e.text(&ps), var.name),
                        });
                    }
                }
            }
            if var.lo >= 1 && hi - 1 <= ext {
                let c = self.g.rng.range(1, var.lo.min(2));
                options.push(Aff {
                    terms: vec![(v, 1)],
                    cst: -c,
                    text: format!("{} - {c}", var.name),
                });
            }
            // Rarely a var whose range is wider: inference narrows it.
            if self.g.rng.chance(0.03) {
                options.push(Aff::var(v, &var.name));
            }
        }
        if options.is_empty() || self.g.rng.chance(0.15) {
            if self.nred() < self.max_red {
                let hi = ext_sym.unwrap_or(Ext::lit(ext));
                let v = self.new_var(0, hi, false);
                return Some(Aff::var(v, &self.vars[v].name.clone()));
            }
            if options.is_empty() || self.g.rng.chance(0.3) {
                return Some(Aff::cst(self.g.rng.range(0, ext - 1)));
            }
        }
        Some(self.g.rng.pick(&options).clone())
    }

    /// A read of a new input whose extents follow its subscripts.
    fn new_input_read(&mut self) -> Option<E> {
        let rank = *self.g.rng.pick(&[0usize, 1, 1, 2, 2, 2, 3, 3]);
        let ps = self.g.p.params.clone();
        let mut subs = vec![];
        let mut shape = vec![];
        for _ in 0..rank {
            let (a, e) = self.new_sub();
            subs.push(a);
            shape.push(e);
        }
        let n: i64 = shape.iter().map(|e| e.eval(&ps)).product();
        if n > 60_000 || shape.iter().any(|e| e.eval(&ps) < 1) {
            return None;
        }
        // Narrow inputs: f16 mostly, an 8-bit float or a bool at times
        // (read in f32 like f16, a bool as 0 or 1; their values are exact,
        // so no rounding reaches the check).
        let dtype = if self.g.rng.chance(0.35) {
            *self
                .g
                .rng
                .pick(&["f16", "f16", "f16", "f8e4m3", "f8e5m2", "bool"])
        } else {
            "f32"
        };
        let t = self.g.add_tensor(Role::Input, dtype, Some(shape));
        let text = access_text(&self.g.p.tensors[t].name, &subs);
        self.reads.push(Read { tensor: t, subs });
        Some(E { text, bound: 1.0 })
    }

    fn new_sub(&mut self) -> (Aff, Ext) {
        let slack = if self.g.rng.chance(0.1) {
            self.g.rng.range(1, 2)
        } else {
            0
        };
        let can_red = self.nred() < self.max_red;
        let nv = self.vars.len();
        let c = self.g.rng.below(10);
        if nv > 0 && c < 7 {
            let v = self.g.rng.below(nv);
            let var = self.vars[v].clone();
            if var.lo < 0 {
                return (Aff::cst(0), Ext::lit(1));
            }
            let form = self.g.rng.below(10);
            if form == 0 {
                let c = self.g.rng.range(1, 3);
                return (
                    Aff {
                        terms: vec![(v, 1)],
                        cst: c,
                        text: format!("{} + {c}", var.name),
                    },
                    var.hi.plus(c + slack),
                );
            }
            if form == 1 && var.lo >= 1 {
                let c = self.g.rng.range(1, var.lo.min(2));
                return (
                    Aff {
                        terms: vec![(v, 1)],
                        cst: -c,
                        text: format!("{} - {c}", var.name),
                    },
                    var.hi.plus(slack - c),
                );
            }
            if form == 2 && can_red && var.hi.mul <= 1 {
                // Pooling: 2*x + u, u in 0:2.
                let u = self.new_var(0, Ext::lit(2), true);
                let un = self.vars[u].name.clone();
                return (
                    Aff {
                        terms: vec![(v, 2), (u, 1)],
                        cst: 0,
                        text: format!("2*{} + {un}", var.name),
                    },
                    var.hi.times(2).plus(slack),
                );
            }
            if form == 3 && can_red {
                // Convolution: x + y, y in 0:r (stated or inferred from
                // another read).
                let r = self.g.rng.range(2, 4);
                let y = self.new_var(0, Ext::lit(r), true);
                let yn = self.vars[y].name.clone();
                return (
                    Aff {
                        terms: vec![(v, 1), (y, 1)],
                        cst: 0,
                        text: format!("{} + {yn}", var.name),
                    },
                    var.hi.plus(r - 1 + slack),
                );
            }
            return (Aff::var(v, &var.name), var.hi.plus(slack));
        }
        if can_red && c < 9 {
            let e = self.g.random_ext();
            let explicit = self.g.rng.chance(0.2);
            let v = self.new_var(0, e.clone(), explicit);
            return (Aff::var(v, &self.vars[v].name.clone()), e);
        }
        let k = self.g.rng.range(0, 3);
        (Aff::cst(k), Ext::lit(k + 1 + slack))
    }

    /// Extra `where` conditions between a reduction index and a left-side
    /// index (triangular: `k <= i`), sometimes; sometimes a union of two
    /// such (a band with a global column: `(i - k < 2 && k <= i) || k < 1`).
    fn constraints(&mut self) -> Vec<Cond> {
        let out = self.comparisons();
        if !out.is_empty() && self.g.rng.chance(0.35) {
            let mut other = self.comparisons();
            if other.is_empty() {
                let r = self.nlhs + self.g.rng.below(self.nred());
                other.push(Constraint {
                    a: Aff::var(r, &self.vars[r].name.clone()),
                    rel: Rel::Lt,
                    b: Aff::cst(self.g.rng.range(1, 3)),
                });
            }
            let band = if self.g.rng.chance(0.5) {
                let again = self.comparisons();
                out.into_iter().chain(again).collect()
            } else {
                out
            };
            return vec![Cond(vec![band, other])];
        }
        out.into_iter().map(Cond::one).collect()
    }

    /// A comparison between a reduction index and a left-side index,
    /// sometimes.
    fn comparisons(&mut self) -> Vec<Constraint> {
        let mut out = vec![];
        if self.nred() > 0 && self.nlhs > 0 && self.g.rng.chance(0.3) {
            let r = self.nlhs + self.g.rng.below(self.nred());
            let l = self.g.rng.below(self.nlhs);
            let (rn, ln) = (self.vars[r].name.clone(), self.vars[l].name.clone());
            let c = match self.g.rng.below(3) {
                0 => Constraint {
                    a: Aff::var(r, &rn),
                    rel: Rel::Le,
                    b: Aff::var(l, &ln),
                },
                1 => Constraint {
                    a: Aff {
                        terms: vec![(l, 1), (r, -1)],
                        cst: 0,
                        text: format!("{ln} - {rn}"),
                    },
                    rel: Rel::Lt,
                    b: Aff::cst(self.g.rng.range(1, 4)),
                },
                _ => Constraint {
                    a: Aff::var(r, &rn),
                    rel: Rel::Ge,
                    b: Aff::var(l, &ln),
                },
            };
            out.push(c);
        }
        out
    }
}

fn access_text(name: &str, subs: &[Aff]) -> String {
    let s: Vec<&str> = subs.iter().map(|a| a.text.as_str()).collect();
    format!("{name}({})", s.join(", "))
}

fn paren(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_alphanumeric() || c == '(' || c == ')' || c == ',')
    {
        s.to_string()
    } else {
        format!("({s})")
    }
}
