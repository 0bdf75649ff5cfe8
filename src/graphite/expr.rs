//! Render targets, parsed as graphite-web's grammar takes them: a path expression (a dotted
//! glob: `*`, `?`, `[...]`, `{a,b}`; `\` escapes a symbol), or a function call whose arguments
//! are numbers, strings (`'…'` or `"…"`, kept as typed, backslashes and all), `true`/`false`,
//! `none`, `inf`, keyword arguments (`name=value`) and nested targets; `a|f()|g()` is
//! `g(f(a))`. Unlike graphite-web, which evaluates the longest prefix that parses and ignores the
//! rest, a target must parse whole: anything else is an error naming the position.

/// A parsed target.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A path expression: one series name or a glob over them.
    Path(String),
    Call(Call),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    None,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub args: Vec<Expr>,
    pub kwargs: Vec<(String, Expr)>,
    /// The call's text as typed (quotes and spaces included): a `seriesByTag(...)` call is its
    /// own path expression in the names graphite-web gives.
    pub raw: String,
}

/// Symbols that cannot stand in a path unescaped.
const SYMBOLS: &[u8] = b"(){},.'\"\\|";

/// How deeply calls may nest (pipes count as nesting): far beyond any dashboard's, and short of
/// what evaluating them would take of a thread's stack.
pub const MAX_DEPTH: usize = 64;

/// How long a target may be.
pub const MAX_LENGTH: usize = 64 * 1024;

/// Parses a whole target; the error names the byte position and what was expected there.
pub fn parse(target: &str) -> Result<Expr, String> {
    if target.len() > MAX_LENGTH {
        return Err(format!(
            "the target is {} bytes long; at most {MAX_LENGTH} are read",
            target.len()
        ));
    }
    let mut p = Parser {
        s: target,
        at: 0,
        depth: 0,
    };
    p.space();
    let e = p.expression()?;
    p.space();
    if p.at < target.len() {
        return Err(p.error("the end of the target"));
    }
    Ok(e)
}

struct Parser<'a> {
    s: &'a str,
    at: usize,
    /// Calls open (and pipes applied) around the position.
    depth: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.at..]
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.at).copied()
    }

    fn space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn error(&self, expected: &str) -> String {
        let found: String = self.rest().chars().take(20).collect();
        if found.is_empty() {
            format!("position {}: expected {expected}, found the end", self.at)
        } else {
            format!("position {}: expected {expected}, found `{found}`", self.at)
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.space();
        if self.peek() == Some(b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// One level deeper, or the error when that is past [`MAX_DEPTH`].
    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!(
                "position {}: calls nest deeper than {MAX_DEPTH}, the limit",
                self.at
            ));
        }
        Ok(())
    }

    /// `(call | path) ( '|' call )*`
    fn expression(&mut self) -> Result<Expr, String> {
        let depth = self.depth;
        let e = self.piped();
        self.depth = depth;
        e
    }

    fn piped(&mut self) -> Result<Expr, String> {
        self.space();
        let mut e = match self.call()? {
            Some(call) => Expr::Call(call),
            None => Expr::Path(self.path()?),
        };
        loop {
            let before = self.at;
            if !self.eat(b'|') {
                self.at = before;
                return Ok(e);
            }
            self.space();
            self.deeper()?;
            match self.call()? {
                Some(mut call) => {
                    call.args.insert(0, e);
                    e = Expr::Call(call);
                }
                None => return Err(self.error("a function call after `|`")),
            }
        }
    }

    /// A name followed by `(`, else `None` with nothing consumed.
    fn call(&mut self) -> Result<Option<Call>, String> {
        let start = self.at;
        let name_len = identifier_len(self.rest());
        if name_len == 0 {
            return Ok(None);
        }
        let name = self.rest()[..name_len].to_string();
        self.at += name_len;
        // The name is the start of a path unless a `(` follows it at once.
        if self.peek() != Some(b'(') {
            self.at = start;
            return Ok(None);
        }
        self.at += 1;
        self.deeper()?;
        let (mut args, mut kwargs) = (Vec::new(), Vec::new());
        self.space();
        if self.peek() != Some(b')') {
            loop {
                self.space();
                let kw = identifier_len(self.rest());
                let after = self.rest()[kw..].trim_start();
                if kw > 0 && after.starts_with('=') && !after.starts_with("==") {
                    let key = self.rest()[..kw].to_string();
                    self.at += kw;
                    self.eat(b'=');
                    kwargs.push((key, self.argument()?));
                } else if kwargs.is_empty() {
                    args.push(self.argument()?);
                } else {
                    return Err(self.error("a keyword argument (`name=value`)"));
                }
                if !self.eat(b',') {
                    break;
                }
            }
        }
        if !self.eat(b')') {
            return Err(self.error("`,` or `)`"));
        }
        self.depth -= 1;
        Ok(Some(Call {
            name,
            args,
            kwargs,
            raw: self.s[start..self.at].to_string(),
        }))
    }

    fn argument(&mut self) -> Result<Expr, String> {
        self.space();
        let rest = self.rest();
        // Keywords, as whole words.
        let word = identifier_len(rest);
        let keyword = rest[..word].to_ascii_lowercase();
        let ends = |n: usize| !rest[n..].starts_with('(');
        match keyword.as_str() {
            "true" | "false" if ends(word) => {
                self.at += word;
                return Ok(Expr::Bool(keyword == "true"));
            }
            "none" if ends(word) => {
                self.at += word;
                return Ok(Expr::None);
            }
            "inf" if ends(word) => {
                self.at += word;
                return Ok(Expr::Float(f64::INFINITY));
            }
            _ => {}
        }
        if let Some(quote @ (b'\'' | b'"')) = self.peek() {
            return self.string(quote);
        }
        if let Some((number, len)) = number(rest) {
            let after = rest[len..].trim_start();
            if after.is_empty() || after.starts_with([',', ')']) {
                self.at += len;
                return Ok(number);
            }
        }
        self.expression()
    }

    /// A quoted string, its text between the quotes as typed (a backslash escapes the quote).
    fn string(&mut self, quote: u8) -> Result<Expr, String> {
        let start = self.at;
        let bytes = self.s.as_bytes();
        let mut i = self.at + 1;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 2,
                b if b == quote => {
                    self.at = i + 1;
                    return Ok(Expr::Str(self.s[start + 1..i].to_string()));
                }
                b'\n' | b'\r' => break,
                _ => i += 1,
            }
        }
        self.at = start;
        Err(self.error("a closing quote"))
    }

    /// A path expression: elements of path characters, escaped symbols and `{a,b}` lists,
    /// joined by dots, without spaces.
    fn path(&mut self) -> Result<String, String> {
        let start = self.at;
        let bytes = self.s.as_bytes();
        let mut out = String::new();
        let mut i = self.at;
        loop {
            // One element.
            let element_start = out.len();
            loop {
                match bytes.get(i) {
                    Some(b'\\')
                        if bytes
                            .get(i + 1)
                            .is_some_and(|b| SYMBOLS.contains(b) || *b == b'=') =>
                    {
                        out.push(bytes[i + 1] as char);
                        i += 2;
                    }
                    Some(b'{') => {
                        let close = self.s[i..].find('}').map(|c| i + c);
                        match close {
                            Some(c)
                                if !self.s[i + 1..c].contains(['(', ')', '{', '\'', '"', '|']) =>
                            {
                                out.push_str(&self.s[i..=c]);
                                i = c + 1;
                            }
                            _ => {
                                self.at = i;
                                return Err(self.error("a `{a,b}` list closed by `}`"));
                            }
                        }
                    }
                    Some(&b) if b > b' ' && b != 0x7f && !SYMBOLS.contains(&b) => {
                        let c = self.s[i..].chars().next().unwrap_or_default();
                        out.push(c);
                        i += c.len_utf8();
                    }
                    _ => break,
                }
            }
            if out.len() == element_start {
                self.at = i;
                return Err(self.error(if i == start {
                    "a series name, a glob or a function call"
                } else {
                    "a path element after `.`"
                }));
            }
            if bytes.get(i) == Some(&b'.') {
                out.push('.');
                i += 1;
            } else {
                break;
            }
        }
        self.at = i;
        Ok(out)
    }
}

fn identifier_len(s: &str) -> usize {
    let b = s.as_bytes();
    if !b
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        return 0;
    }
    b.iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count()
}

/// A number at the start of `s` (`-?\d+`, `-?\d+\.\d+`, either with an exponent) and its length.
fn number(s: &str) -> Option<(Expr, usize)> {
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let int_digits = digits(i);
    if int_digits == 0 {
        return None;
    }
    i += int_digits;
    let mut float = false;
    if b.get(i) == Some(&b'.') && digits(i + 1) > 0 {
        i += 1 + digits(i + 1);
        float = true;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        let sign = usize::from(b.get(i + 1) == Some(&b'-'));
        let exp = digits(i + 1 + sign);
        if exp > 0 {
            i += 1 + sign + exp;
            float = true;
        }
    }
    let text = &s[..i];
    let value = if float {
        Expr::Float(text.parse().ok()?)
    } else {
        match text.parse() {
            Ok(n) => Expr::Int(n),
            Err(_) => Expr::Float(text.parse().ok()?),
        }
    };
    Some((value, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(e: &Expr) -> &Call {
        match e {
            Expr::Call(c) => c,
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn grafanas_wrapped_target() {
        let e = parse(r#"aliasSub(sumSeries(web.*.hits), "(^.*$)", "\1 A")"#).unwrap();
        let c = call(&e);
        assert_eq!(c.name, "aliasSub");
        assert_eq!(c.args[1], Expr::Str("(^.*$)".into()));
        assert_eq!(c.args[2], Expr::Str(r"\1 A".into()));
        assert_eq!(call(&c.args[0]).args[0], Expr::Path("web.*.hits".into()));
    }

    #[test]
    fn paths_numbers_keywords_and_pipes() {
        assert_eq!(
            parse("web.{home,cart}.hits").unwrap(),
            Expr::Path("web.{home,cart}.hits".into())
        );
        assert_eq!(
            parse("api.calls;env=prod").unwrap(),
            Expr::Path("api.calls;env=prod".into())
        );
        let e = parse("summarize(x, '1min', func='max', alignToFrom=true)").unwrap();
        let c = call(&e);
        assert_eq!(c.kwargs[0], ("func".into(), Expr::Str("max".into())));
        assert_eq!(c.kwargs[1], ("alignToFrom".into(), Expr::Bool(true)));
        let e = parse("scale(x, -0.5)").unwrap();
        assert_eq!(call(&e).args[1], Expr::Float(-0.5));
        let e = parse("constantLine(100)").unwrap();
        assert_eq!(call(&e).args[0], Expr::Int(100));
        let e = parse("seriesByTag('name=a')|sumSeries()|alias('t')").unwrap();
        let c = call(&e);
        assert_eq!(c.name, "alias");
        let inner = call(&c.args[0]);
        assert_eq!(inner.name, "sumSeries");
        assert_eq!(call(&inner.args[0]).raw, "seriesByTag('name=a')");
    }

    #[test]
    fn nesting_is_bounded() {
        let nested = |n: usize| format!("{}x{}", "sumSeries(".repeat(n), ")".repeat(n));
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        assert!(
            parse(&nested(MAX_DEPTH + 1))
                .unwrap_err()
                .contains("deeper than 64")
        );
        assert!(
            parse(&"sumSeries(".repeat(5000))
                .unwrap_err()
                .contains("deeper")
        );
        let piped = format!("x{}", "|scale(1)".repeat(MAX_DEPTH + 1));
        assert!(parse(&piped).unwrap_err().contains("deeper"));
        assert!(
            parse(&"a".repeat(MAX_LENGTH + 1))
                .unwrap_err()
                .contains("bytes long")
        );
    }

    #[test]
    fn a_target_that_does_not_parse_names_the_position() {
        assert!(
            parse("sumSeries(web.*.hits")
                .unwrap_err()
                .contains("position 20")
        );
        assert!(parse("web.home.hits)").unwrap_err().contains("position 13"));
        assert!(parse("a..b").unwrap_err().contains("position 2"));
        assert!(parse("f(x, 'open)").unwrap_err().contains("closing quote"));
    }
}
