//! Lexer and recursive-descent parser for TC statements. The parser builds
//! an untyped tree ([`Raw`]); names are resolved and types checked in
//! `resolve`.
//!
//! ```text
//! stmt   := access op expr [ "where" clause { "," clause } ]
//! clause := IDX "in" add ":" add | conj { "||" conj }
//! conj   := cmps | "(" cmps ")"     cmps := add REL add { "&&" add REL add }
//! expr   := or [ "?" expr ":" expr ]
//! or     := and { "||" and }        and := cmp { "&&" cmp }
//! cmp    := add [ ("<"|"<="|">"|">="|"=="|"!=") add ]
//! add    := mul { ("+"|"-") mul }   mul := unary { ("*"|"/") unary }
//! unary  := ("-"|"!") unary | primary
//! primary:= number | NAME [ "(" [ expr { "," expr } ] ")" ] | "(" expr ")"
//! ```

use crate::frontend::ast::{BinOp, Rel, UnOp};

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Num(f64, bool),
    Sym(&'static str),
}

const SYMBOLS: [&str; 22] = [
    "==", "!=", "<=", ">=", "&&", "||", "+=", "*=", "(", ")", ",", ":", "?", "+", "-", "*", "/",
    "<", ">", "=", "!", ".",
];

pub fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let st = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(s[st..i].to_string()));
        } else if c.is_ascii_digit() || (c == '.' && i + 1 < b.len() && b[i + 1].is_ascii_digit()) {
            let st = i;
            let mut is_int = true;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i < b.len() && b[i] == b'.' {
                is_int = false;
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
                let mut j = i + 1;
                if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                    j += 1;
                }
                if j < b.len() && b[j].is_ascii_digit() {
                    is_int = false;
                    i = j;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text = &s[st..i];
            let v: f64 = text.parse().map_err(|_| format!("bad number `{text}`"))?;
            out.push(Tok::Num(v, is_int));
        } else {
            let sym = SYMBOLS
                .iter()
                .find(|sym| s[i..].starts_with(**sym))
                .ok_or_else(|| format!("unexpected character `{c}`"))?;
            if *sym == "." {
                return Err("unexpected character `.`".into());
            }
            out.push(Tok::Sym(sym));
            i += sym.len();
        }
    }
    Ok(out)
}

/// An untyped expression as written.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw {
    Num(f64, bool),
    Name(String),
    /// `NAME(args)`: a tensor access, a function call or a cast.
    Call(String, Vec<Raw>),
    Unary(UnOp, Box<Raw>),
    Binary(BinOp, Box<Raw>, Box<Raw>),
    Select(Box<Raw>, Box<Raw>, Box<Raw>),
}

/// A `where` clause before resolution.
#[derive(Debug, Clone, PartialEq)]
pub enum RawClause {
    Range(String, Raw, Raw),
    /// A union of conjunctions of comparisons: `(a && b) || c` is
    /// `[[a, b], [c]]`; a plain comparison is `[[a]]`.
    Condition(Vec<Vec<RawComparison>>),
}

/// `lhs REL rhs` in a `where` condition, before resolution.
pub type RawComparison = (Raw, Rel, Raw);

/// A statement before resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct RawStatement {
    pub lhs: String,
    pub lhs_args: Vec<Raw>,
    /// `=`, `+=`, `*=`, `max=`, `min=`.
    pub op: String,
    pub bang: bool,
    pub rhs: Raw,
    pub wheres: Vec<RawClause>,
}

struct P {
    t: Vec<Tok>,
    i: usize,
}

fn show(t: Option<&Tok>) -> String {
    match t {
        None => "the end of the statement".into(),
        Some(Tok::Ident(s)) => format!("`{s}`"),
        Some(Tok::Num(v, _)) => format!("`{v}`"),
        Some(Tok::Sym(s)) => format!("`{s}`"),
    }
}

impl P {
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }
    fn is(&self, s: &str) -> bool {
        matches!(self.peek(), Some(Tok::Sym(x)) if *x == s)
    }
    fn eat(&mut self, s: &str) -> bool {
        if self.is(s) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, s: &str) -> Result<(), String> {
        if self.eat(s) {
            Ok(())
        } else {
            Err(format!("expected `{s}` but found {}", show(self.peek())))
        }
    }
    fn ident(&mut self) -> Result<String, String> {
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.i += 1;
                Ok(s)
            }
            t => Err(format!("expected a name but found {}", show(t))),
        }
    }
    fn is_ident(&self, s: &str) -> bool {
        matches!(self.peek(), Some(Tok::Ident(x)) if x == s)
    }

    fn expr(&mut self) -> Result<Raw, String> {
        let c = self.or()?;
        if self.eat("?") {
            let a = self.expr()?;
            self.expect(":")?;
            let b = self.expr()?;
            return Ok(Raw::Select(Box::new(c), Box::new(a), Box::new(b)));
        }
        Ok(c)
    }
    fn or(&mut self) -> Result<Raw, String> {
        let mut a = self.and()?;
        while self.eat("||") {
            a = Raw::Binary(BinOp::Or, Box::new(a), Box::new(self.and()?));
        }
        Ok(a)
    }
    fn and(&mut self) -> Result<Raw, String> {
        let mut a = self.cmp()?;
        while self.eat("&&") {
            a = Raw::Binary(BinOp::And, Box::new(a), Box::new(self.cmp()?));
        }
        Ok(a)
    }
    fn cmp(&mut self) -> Result<Raw, String> {
        let a = self.add()?;
        for (s, op) in [
            ("<=", BinOp::Le),
            (">=", BinOp::Ge),
            ("<", BinOp::Lt),
            (">", BinOp::Gt),
            ("==", BinOp::Eq),
            ("!=", BinOp::Ne),
        ] {
            if self.eat(s) {
                return Ok(Raw::Binary(op, Box::new(a), Box::new(self.add()?)));
            }
        }
        Ok(a)
    }
    fn add(&mut self) -> Result<Raw, String> {
        let mut a = self.mul()?;
        loop {
            let op = if self.eat("+") {
                BinOp::Add
            } else if self.eat("-") {
                BinOp::Sub
            } else {
                return Ok(a);
            };
            a = Raw::Binary(op, Box::new(a), Box::new(self.mul()?));
        }
    }
    fn mul(&mut self) -> Result<Raw, String> {
        let mut a = self.unary()?;
        loop {
            let op = if self.eat("*") {
                BinOp::Mul
            } else if self.eat("/") {
                BinOp::Div
            } else {
                return Ok(a);
            };
            a = Raw::Binary(op, Box::new(a), Box::new(self.unary()?));
        }
    }
    fn unary(&mut self) -> Result<Raw, String> {
        if self.eat("-") {
            return Ok(Raw::Unary(UnOp::Neg, Box::new(self.unary()?)));
        }
        if self.eat("!") {
            return Ok(Raw::Unary(UnOp::Not, Box::new(self.unary()?)));
        }
        self.primary()
    }
    fn primary(&mut self) -> Result<Raw, String> {
        match self.peek().cloned() {
            Some(Tok::Num(v, int)) => {
                self.i += 1;
                Ok(Raw::Num(v, int))
            }
            Some(Tok::Ident(name)) => {
                self.i += 1;
                if self.eat("(") {
                    let mut args = Vec::new();
                    if !self.eat(")") {
                        loop {
                            args.push(self.expr()?);
                            if self.eat(")") {
                                break;
                            }
                            self.expect(",")?;
                        }
                    }
                    Ok(Raw::Call(name, args))
                } else {
                    Ok(Raw::Name(name))
                }
            }
            Some(Tok::Sym("(")) => {
                self.i += 1;
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            t => Err(format!(
                "expected an expression but found {}",
                show(t.as_ref())
            )),
        }
    }
    fn clause(&mut self) -> Result<RawClause, String> {
        if let (Some(Tok::Ident(name)), Some(Tok::Ident(kw))) =
            (self.t.get(self.i), self.t.get(self.i + 1))
        {
            if kw == "in" {
                let name = name.clone();
                self.i += 2;
                let lo = self.add()?;
                self.expect(":")?;
                let hi = self.add()?;
                return Ok(RawClause::Range(name, lo, hi));
            }
        }
        let mut union = vec![self.conjunction()?];
        while self.eat("||") {
            union.push(self.conjunction()?);
        }
        Ok(RawClause::Condition(union))
    }
    /// `cmp { && cmp }` or `( cmp { && cmp } )`. A parenthesis that does
    /// not close a conjunction belongs to the comparison's left side, as
    /// in `(i + 1) <= j`.
    fn conjunction(&mut self) -> Result<Vec<RawComparison>, String> {
        if self.is("(") {
            let start = self.i;
            self.i += 1;
            if let Ok(c) = self.comparisons() {
                if self.eat(")") && matches!(self.peek(), None | Some(Tok::Sym("," | "||"))) {
                    return Ok(c);
                }
            }
            self.i = start;
        }
        self.comparisons()
    }
    fn comparisons(&mut self) -> Result<Vec<RawComparison>, String> {
        let mut out = vec![self.comparison()?];
        while self.eat("&&") {
            out.push(self.comparison()?);
        }
        Ok(out)
    }
    fn comparison(&mut self) -> Result<RawComparison, String> {
        let a = self.add()?;
        let rel = [
            ("<=", Rel::Le),
            (">=", Rel::Ge),
            ("<", Rel::Lt),
            (">", Rel::Gt),
            ("==", Rel::Eq),
        ]
        .into_iter()
        .find(|(s, _)| self.is(s));
        let Some((s, rel)) = rel else {
            return Err(format!(
                "a where clause is `IDX in lo:hi` or a comparison such as `j <= i` (several joined by `&&` in parentheses, and alternatives by `||`); found {} after the left side",
                show(self.peek())
            ));
        };
        self.expect(s)?;
        let b = self.add()?;
        Ok((a, rel, b))
    }
}

/// Parses one statement.
pub fn parse_statement(text: &str) -> Result<RawStatement, String> {
    let mut p = P {
        t: lex(text)?,
        i: 0,
    };
    let lhs = p.ident()?;
    p.expect("(")?;
    let mut lhs_args = Vec::new();
    if !p.eat(")") {
        loop {
            lhs_args.push(p.add()?);
            if p.eat(")") {
                break;
            }
            p.expect(",")?;
        }
    }
    let op = if p.eat("=") {
        "="
    } else if p.eat("+=") {
        "+="
    } else if p.eat("*=") {
        "*="
    } else if (p.is_ident("max") || p.is_ident("min"))
        && matches!(p.t.get(p.i + 1), Some(Tok::Sym("=")))
    {
        let m = if p.is_ident("max") { "max=" } else { "min=" };
        p.i += 2;
        m
    } else {
        return Err(format!(
            "expected an assignment operator (=, +=, *=, max=, min=, with an optional !) but found {}",
            show(p.peek())
        ));
    };
    let bang = op != "=" && p.eat("!");
    let rhs = p.expr()?;
    let mut wheres = Vec::new();
    if p.is_ident("where") {
        p.i += 1;
        loop {
            wheres.push(p.clause()?);
            if !p.eat(",") {
                break;
            }
        }
    }
    if p.i < p.t.len() {
        return Err(format!("unexpected {} after the statement", show(p.peek())));
    }
    Ok(RawStatement {
        lhs,
        lhs_args,
        op: op.to_string(),
        bang,
        rhs,
        wheres,
    })
}

/// Parses a loop block's `for` text, `IDX in lo:hi`.
pub fn parse_for(text: &str) -> Result<(String, Raw, Raw), String> {
    let mut p = P {
        t: lex(text)?,
        i: 0,
    };
    let bad = || format!("`{text}` is not `IDX in lo:hi`");
    let Ok(RawClause::Range(name, lo, hi)) = p.clause() else {
        return Err(bad());
    };
    if p.i < p.t.len() {
        return Err(format!("unexpected {} in `{text}`", show(p.peek())));
    }
    Ok((name, lo, hi))
}

/// Parses an affine-looking expression (tensor shapes).
pub fn parse_additive(text: &str) -> Result<Raw, String> {
    let mut p = P {
        t: lex(text)?,
        i: 0,
    };
    let e = p.add()?;
    if p.i < p.t.len() {
        return Err(format!("unexpected {} in `{text}`", show(p.peek())));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexes_numbers_and_operators() {
        let t = lex("x +=! 1e-5 * .5 <= 2").unwrap();
        assert_eq!(t[1], Tok::Sym("+="));
        assert_eq!(t[2], Tok::Sym("!"));
        assert_eq!(t[3], Tok::Num(1e-5, false));
        assert_eq!(t[5], Tok::Num(0.5, false));
        assert_eq!(t[6], Tok::Sym("<="));
        assert_eq!(t[7], Tok::Num(2.0, true));
        assert!(lex("a # b").unwrap_err().contains('#'));
    }

    #[test]
    fn precedence_is_c_like() {
        let s = parse_statement("Y(i) = a + b * c < d ? -e : f").unwrap();
        match s.rhs {
            Raw::Select(c, a, _) => {
                assert!(matches!(*c, Raw::Binary(BinOp::Lt, ..)));
                assert!(matches!(*a, Raw::Unary(UnOp::Neg, _)));
                if let Raw::Binary(BinOp::Lt, l, _) = *c {
                    assert!(
                        matches!(*l, Raw::Binary(BinOp::Add, _, ref r) if matches!(**r, Raw::Binary(BinOp::Mul, ..)))
                    );
                }
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_operator_parses() {
        for (src, op, bang) in [
            ("X(i) = Y(i)", "=", false),
            ("X(i) += Y(i)", "+=", false),
            ("X(i) *= Y(i)", "*=", false),
            ("X(i) max= Y(i)", "max=", false),
            ("X(i) min= Y(i)", "min=", false),
            ("X(i) +=! Y(i)", "+=", true),
            ("X(i) *=! Y(i)", "*=", true),
            ("X(i) max=! Y(i)", "max=", true),
            ("X(i) min=! Y(i)", "min=", true),
        ] {
            let s = parse_statement(src).unwrap();
            assert_eq!((s.op.as_str(), s.bang), (op, bang), "{src}");
        }
        assert!(parse_statement("X(i) - Y(i)")
            .unwrap_err()
            .contains("assignment operator"));
    }

    #[test]
    fn where_clauses() {
        let s = parse_statement("P(b, i) max=! X(b, 2*i + u) where u in 0:2, u <= i").unwrap();
        assert_eq!(s.wheres.len(), 2);
        assert!(matches!(&s.wheres[0], RawClause::Range(n, _, _) if n == "u"));
        assert!(
            matches!(&s.wheres[1], RawClause::Condition(u) if u.len() == 1 && u[0].len() == 1 && u[0][0].1 == Rel::Le)
        );
        assert!(parse_statement("P(i) = X(i) where i").is_err());
    }

    #[test]
    fn disjunctive_where_clauses() {
        let s =
            parse_statement("O(i) +=! A(i, j) where (j >= i - W && j <= i + W) || j < G, j < N")
                .unwrap();
        assert_eq!(s.wheres.len(), 2);
        let RawClause::Condition(u) = &s.wheres[0] else {
            panic!("{:?}", s.wheres[0]);
        };
        assert_eq!(u.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![2, 1]);
        // A parenthesised left side is not a conjunction.
        let s = parse_statement("O(i) +=! A(i, j) where (i + 1) <= j").unwrap();
        assert!(matches!(&s.wheres[0], RawClause::Condition(u) if u.len() == 1 && u[0].len() == 1));
        // `&&` binds tighter than `||` without parentheses too.
        let s = parse_statement("O(i) +=! A(i, j) where j < 2 && i < 2 || j > 5").unwrap();
        assert!(matches!(&s.wheres[0], RawClause::Condition(u) if u.len() == 2 && u[0].len() == 2));
        assert!(parse_statement("O(i) +=! A(i, j) where (j < 2 || j > 5").is_err());
        assert!(parse_statement("O(i) +=! A(i, j) where j < 2 ||").is_err());
        assert!(parse_statement("P(i) = X(i) extra")
            .unwrap_err()
            .contains("extra"));
    }
}
