//! Polynomials in two variables, written as text: the configurable time models.
//!
//! Prefill and decode times differ by model, GPU and parallelism, so the conductor does not
//! hard-code them: an operator fits a polynomial to measurements and writes it in the config
//! (or on the command line) as plain arithmetic, e.g. for prefill (`n` prompt tokens, `c`
//! cached tokens):
//!
//! ```text
//! 10 + 0.08*n - 0.08*c + 1.5e-6*n^2 - 1.5e-6*c^2
//! ```
//!
//! Grammar: terms joined by `+` or `-`; a term is a product (`*`) of numbers and variables,
//! each variable with an optional integer power (`^k`, `k` ≤ 8). Whitespace is ignored.

use std::fmt;

/// A polynomial `sum(coef * x^i * y^j)` over two named variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Polynomial {
    vars: [char; 2],
    terms: Vec<Term>,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Term {
    coef: f64,
    pow: [i32; 2],
}

/// Why a polynomial did not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolyError {
    #[error("unexpected {found:?} at offset {at} (variables are {vars})")]
    Unexpected {
        found: String,
        at: usize,
        vars: String,
    },
    #[error("bad number {0:?}")]
    Number(String),
    #[error("power must be an integer between 0 and 8")]
    Power,
    #[error("empty polynomial")]
    Empty,
}

impl Polynomial {
    /// Parses `text` over the variables `vars` (e.g. `['n', 'c']`).
    pub fn parse(text: &str, vars: [char; 2]) -> Result<Polynomial, PolyError> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
            vars,
        };
        let mut terms = Vec::new();
        p.skip_ws();
        let mut sign = 1.0;
        if p.eat(b'-') {
            sign = -1.0;
        } else {
            p.eat(b'+');
        }
        loop {
            let mut t = p.term()?;
            t.coef *= sign;
            terms.push(t);
            p.skip_ws();
            if p.i >= p.s.len() {
                break;
            }
            sign = if p.eat(b'+') {
                1.0
            } else if p.eat(b'-') {
                -1.0
            } else {
                return Err(p.unexpected());
            };
        }
        if terms.is_empty() {
            return Err(PolyError::Empty);
        }
        Ok(Polynomial {
            vars,
            terms,
            text: text.trim().to_owned(),
        })
    }

    /// The value at `(x, y)`.
    pub fn eval(&self, x: f64, y: f64) -> f64 {
        self.terms
            .iter()
            .map(|t| t.coef * x.powi(t.pow[0]) * y.powi(t.pow[1]))
            .sum()
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The variable names, in argument order of [`Polynomial::eval`].
    pub fn vars(&self) -> [char; 2] {
        self.vars
    }
}

impl fmt::Display for Polynomial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    vars: [char; 2],
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn unexpected(&self) -> PolyError {
        let rest = &self.s[self.i.min(self.s.len())..];
        let found = String::from_utf8_lossy(&rest[..rest.len().min(8)]).into_owned();
        PolyError::Unexpected {
            found: if found.is_empty() {
                "end".into()
            } else {
                found
            },
            at: self.i,
            vars: format!("{} and {}", self.vars[0], self.vars[1]),
        }
    }

    fn term(&mut self) -> Result<Term, PolyError> {
        let mut t = Term {
            coef: 1.0,
            pow: [0, 0],
        };
        loop {
            self.factor(&mut t)?;
            if !self.eat(b'*') {
                return Ok(t);
            }
        }
    }

    fn factor(&mut self, t: &mut Term) -> Result<(), PolyError> {
        self.skip_ws();
        let Some(&c) = self.s.get(self.i) else {
            return Err(self.unexpected());
        };
        if c.is_ascii_digit() || c == b'.' {
            t.coef *= self.number()?;
            return Ok(());
        }
        let Some(v) = self.vars.iter().position(|&v| v as u32 == c as u32) else {
            return Err(self.unexpected());
        };
        self.i += 1;
        let mut power = 1;
        if self.eat(b'^') {
            self.skip_ws();
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
            power = std::str::from_utf8(&self.s[start..self.i])
                .ok()
                .and_then(|d| d.parse::<i32>().ok())
                .filter(|p| (0..=8).contains(p))
                .ok_or(PolyError::Power)?;
        }
        t.pow[v] += power;
        Ok(())
    }

    fn number(&mut self) -> Result<f64, PolyError> {
        let start = self.i;
        while self.i < self.s.len() {
            let b = self.s[self.i];
            let exp_sign = (b == b'-' || b == b'+')
                && self.i > start
                && matches!(self.s[self.i - 1], b'e' | b'E');
            if b.is_ascii_digit() || b == b'.' || b == b'e' || b == b'E' || exp_sign {
                self.i += 1;
            } else {
                break;
            }
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or(PolyError::Number(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_terms_with_powers_and_signs() {
        let p = Polynomial::parse(
            "10 + 0.08*n - 0.08*c + 1.5e-6*n^2 - 1.5e-6 * c^2",
            ['n', 'c'],
        )
        .expect("parses");
        let expect = |n: f64, c: f64| 10.0 + 0.08 * (n - c) + 1.5e-6 * (n * n - c * c);
        for (n, c) in [(0.0, 0.0), (1000.0, 0.0), (20_000.0, 4096.0)] {
            assert!((p.eval(n, c) - expect(n, c)).abs() < 1e-9, "{n} {c}");
        }
        let q = Polynomial::parse("-2*b*t + 3 * b^2*b", ['b', 't']).expect("parses");
        assert_eq!(q.eval(2.0, 5.0), -20.0 + 24.0);
        assert_eq!(q.text(), "-2*b*t + 3 * b^2*b");
    }

    #[test]
    fn rejects_garbage() {
        let vars = ['n', 'c'];
        assert!(matches!(
            Polynomial::parse("", vars),
            Err(PolyError::Unexpected { .. })
        ));
        assert!(matches!(
            Polynomial::parse("3*x", vars),
            Err(PolyError::Unexpected { .. })
        ));
        assert!(matches!(
            Polynomial::parse("1 +", vars),
            Err(PolyError::Unexpected { .. })
        ));
        assert_eq!(Polynomial::parse("n^99", vars), Err(PolyError::Power));
        assert!(matches!(
            Polynomial::parse("1e999", vars),
            Err(PolyError::Number(_))
        ));
        assert!(matches!(
            Polynomial::parse("1..2", vars),
            Err(PolyError::Number(_))
        ));
        assert!(matches!(
            Polynomial::parse("2 n", vars),
            Err(PolyError::Unexpected { .. })
        ));
    }
}
