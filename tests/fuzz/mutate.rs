//! Mutations of valid programs. A mutant is usually invalid; polyfuse must
//! then exit 2 with a message (or, where the mutant happens to be valid,
//! run and pass its check), never exit 4, panic or crash.

use super::gen::{Program, Role};
use super::rng::Rng;

pub struct Mutant {
    pub kind: &'static str,
    pub json: String,
    /// Extra arguments (`--param`), replacing the program's.
    pub args: Vec<String>,
}

/// The accesses `NAME(args)` of a statement: (start of NAME, end after
/// `)`, args as text).
fn accesses(s: &str) -> Vec<(usize, usize, Vec<String>)> {
    let b = s.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let is_t = matches!(b[i], b'X' | b'Y' | b'T')
            && (i == 0 || !(b[i - 1] as char).is_ascii_alphanumeric())
            && i + 1 < b.len()
            && b[i + 1].is_ascii_digit();
        if is_t {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j < b.len() && b[j] == b'(' {
                let mut depth = 0;
                let mut k = j;
                let mut args = vec![];
                let mut cur = String::new();
                while k < b.len() {
                    let c = b[k] as char;
                    match c {
                        '(' => {
                            depth += 1;
                            if depth > 1 {
                                cur.push(c)
                            }
                        }
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                            cur.push(c);
                        }
                        ',' if depth == 1 => {
                            args.push(cur.trim().to_string());
                            cur.clear();
                        }
                        _ => cur.push(c),
                    }
                    k += 1;
                }
                if !cur.trim().is_empty() {
                    args.push(cur.trim().to_string());
                }
                out.push((i, k + 1, args));
                i = k + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

fn replace_access(s: &str, acc: &(usize, usize, Vec<String>), args: &[String]) -> String {
    let name_end = s[acc.0..].find('(').unwrap() + acc.0;
    format!(
        "{}{}({}){}",
        &s[..acc.0],
        &s[acc.0..name_end],
        args.join(", "),
        &s[acc.1..]
    )
}

const KINDS: [&str; 22] = [
    "drop-statement",
    "swap-statements",
    "swap-subscripts",
    "shift-subscript",
    "unknown-name",
    "bad-dtype",
    "break-json",
    "widen-where",
    "drop-bang",
    "bad-param",
    "missing-param-value",
    "extra-subscript",
    "non-affine",
    "shrink-input",
    "garbage",
    "duplicate-index",
    "f64-read",
    "self-read",
    "unwritten-output",
    "write-input",
    "empty-range",
    "drop-where",
];

/// One mutant of `p` (the kind drawn at random among those that apply).
pub fn mutate(p: &Program, rng: &mut Rng) -> Mutant {
    for _ in 0..50 {
        let kind = *rng.pick(&KINDS);
        if let Some(m) = apply(p, kind, rng) {
            return m;
        }
    }
    let mut q = p.clone();
    q.body[0] = format!("{} $", q.body[0]);
    Mutant {
        kind: "garbage",
        json: q.json(),
        args: p.param_args(),
    }
}

fn apply(p: &Program, kind: &'static str, rng: &mut Rng) -> Option<Mutant> {
    let mut q = p.clone();
    let mut args = p.param_args();
    let n = q.body.len();
    let si = rng.below(n);
    let s = q.body[si].clone();
    let acc = accesses(&s);
    let reads: Vec<_> = acc.iter().skip(1).cloned().collect();
    let mut json = None;
    let needs_reads = matches!(
        kind,
        "swap-subscripts" | "shift-subscript" | "non-affine" | "f64-read"
    );
    if needs_reads && reads.is_empty() || acc.is_empty() {
        return None;
    }
    match kind {
        "drop-statement" => {
            if n < 2 {
                return None;
            }
            q.body.remove(si);
        }
        "swap-statements" => {
            if n < 2 {
                return None;
            }
            let sj = (si + 1 + rng.below(n - 1)) % n;
            q.body.swap(si, sj);
        }
        "swap-subscripts" => {
            let r = rng.pick(&reads);
            if r.2.len() < 2 {
                return None;
            }
            let mut a = r.2.clone();
            a.swap(0, 1);
            q.body[si] = replace_access(&s, r, &a);
        }
        "shift-subscript" => {
            if reads.is_empty() {
                return None;
            }
            let r = rng.pick(&reads);
            if r.2.is_empty() {
                return None;
            }
            let mut a = r.2.clone();
            let d = rng.below(a.len());
            let by = *rng.pick(&[1, 2, 7, 100, -1, -3]);
            a[d] = if by > 0 {
                format!("{} + {by}", a[d])
            } else {
                format!("{} - {}", a[d], -by)
            };
            q.body[si] = replace_access(&s, r, &a);
        }
        "unknown-name" => {
            let r = rng.pick(&acc);
            q.body[si] = format!("{}Qz{}", &s[..r.0], &s[r.0 + 1..]);
        }
        "bad-dtype" => {
            let t = rng.below(q.tensors.len());
            q.tensors[t].dtype =
                *rng.pick(&["f17", "int8", "i128", "boolean", "f8e4m4", "F32", ""]);
        }
        "break-json" => {
            let text = q.json();
            let b = text.as_bytes();
            let i = rng.below(b.len());
            json = Some(match rng.below(3) {
                0 => text[..i].to_string(),
                1 => {
                    let pos: Vec<usize> = (0..b.len())
                        .filter(|&k| matches!(b[k], b'{' | b'}' | b',' | b'"' | b'[' | b']' | b':'))
                        .collect();
                    let k = *rng.pick(&pos);
                    format!("{}{}", &text[..k], &text[k + 1..])
                }
                _ => format!("{}{}", &text[..i], &text[i..].replacen('"', "'", 1)),
            });
        }
        "widen-where" => {
            let k = s.find(" in ")?;
            let colon = s[k..].find(':')? + k;
            let end = s[colon..].find(',').map(|e| e + colon).unwrap_or(s.len());
            let by = *rng.pick(&[1, 3, 50]);
            q.body[si] = format!("{}+{by}{}", &s[..end], &s[end..]);
        }
        "drop-bang" => {
            if !s.contains("=!") {
                return None;
            }
            q.body[si] = s.replacen("=!", "=", 1);
        }
        "bad-param" => {
            let v = *rng.pick(&["0", "-3", "\"x\"", "1.5", "[]"]);
            let text = q.json();
            let name = &q.params[rng.below(q.params.len())].name;
            let key = format!("\"{name}\": ");
            let k = text.find(&key)? + key.len();
            let end = text[k..].find([',', '}'])? + k;
            json = Some(format!("{}{v}{}", &text[..k], &text[end..]));
        }
        "missing-param-value" => {
            if !q.has_symbolic() {
                return None;
            }
            args.clear();
        }
        "extra-subscript" => {
            let r = rng.pick(&acc);
            let mut a = r.2.clone();
            a.push("0".into());
            q.body[si] = replace_access(&s, r, &a);
        }
        "non-affine" => {
            let r = rng.pick(&reads);
            if r.2.is_empty() {
                return None;
            }
            let mut a = r.2.clone();
            let d = rng.below(a.len());
            a[d] = match rng.below(3) {
                0 => format!("({}) * ({})", a[d], a[d]),
                1 => format!("({}) / 2", a[d]),
                _ => format!("{} + 0.5", a[d]),
            };
            q.body[si] = replace_access(&s, r, &a);
        }
        "shrink-input" => {
            let ins: Vec<usize> = (0..q.tensors.len())
                .filter(|&t| {
                    q.tensors[t].role == Role::Input
                        && q.tensors[t]
                            .shape_ext
                            .as_ref()
                            .is_some_and(|s| !s.is_empty())
                })
                .collect();
            if ins.is_empty() {
                return None;
            }
            let t = *rng.pick(&ins);
            let sh = q.tensors[t].shape_ext.as_mut().unwrap();
            let d = rng.below(sh.len());
            if sh[d].eval(&p.params) <= 1 {
                return None;
            }
            sh[d].add -= 1;
        }
        "garbage" => {
            let c = *rng.pick(&['#', '$', '@', '.', ';', '[', '{', '\'', '%', '\\']);
            let i = rng.below(s.len() + 1);
            let mut t = s.clone();
            if !t.is_char_boundary(i) {
                return None;
            }
            t.insert(i, c);
            q.body[si] = t;
        }
        "duplicate-index" => {
            let lhs = &acc[0];
            if lhs.2.len() < 2 {
                return None;
            }
            let mut a = lhs.2.clone();
            a[1] = a[0].clone();
            q.body[si] = replace_access(&s, lhs, &a);
        }
        "f64-read" => {
            let r = rng.pick(&reads);
            let t = &s[r.0..r.1];
            let wrap = *rng.pick(&["f64", "i32"]);
            q.body[si] = format!("{}{wrap}({t}){}", &s[..r.0], &s[r.1..]);
        }
        "self-read" => {
            let lhs = &acc[0];
            let t = s[lhs.0..lhs.1].to_string();
            let op_end = s.find("=")? + 1;
            let bang = s[op_end..].starts_with('!') as usize;
            let shifted = if lhs.2.is_empty() || rng.chance(0.5) {
                t.clone()
            } else {
                let mut a = lhs.2.clone();
                a[0] = format!("{} + 1", a[0]);
                format!("{}({})", &t[..t.find('(').unwrap()], a.join(", "))
            };
            let at = op_end + bang;
            q.body[si] = format!("{} {shifted} +{}", &s[..at], &s[at..]);
        }
        "unwritten-output" => {
            let mut t = q.tensors.iter().find(|t| t.role == Role::Output)?.clone();
            t.name = "Y99".into();
            q.tensors.push(t);
        }
        "write-input" => {
            let x = q
                .tensors
                .iter()
                .find(|t| t.role == Role::Input)?
                .name
                .clone();
            let lhs = &acc[0];
            q.body[si] = format!("{x}{}", &s[s[lhs.0..].find('(')? + lhs.0..]);
        }
        "empty-range" => {
            let k = s.find(" in ")?;
            let colon = s[k..].find(':')? + k;
            let end = s[colon..].find(',').map(|e| e + colon).unwrap_or(s.len());
            q.body[si] = format!("{} in 5:2{}", &s[..k], &s[end..]);
        }
        "drop-where" => {
            let k = s.find(" where ")?;
            q.body[si] = s[..k].to_string();
        }
        _ => unreachable!(),
    }
    let json = json.unwrap_or_else(|| q.json());
    if json == p.json() && args == p.param_args() {
        return None;
    }
    Some(Mutant { kind, json, args })
}
