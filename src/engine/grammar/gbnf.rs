//! llama.cpp's GBNF grammars (`grammar` in a request), read into llguidance's Lark.
//!
//! llama.cpp's server holds an answer to a grammar written in GBNF; llguidance, the
//! constraint engine here, reads a Lark dialect. No Rust crate translates one into the
//! other (llguidance carries a Python script for it), so this module parses GBNF as
//! llama.cpp's grammar parser reads it (`llama-grammar.cpp`: newlines end a rule except
//! inside parentheses or after `|` and `::=`; `#` comments; `{m}`, `{m,}`, `{m,n}`) and
//! writes the same grammar in Lark:
//! - each rule on one line, its name prefixed and case-folded so any GBNF name is a Lark
//!   rule name (`Item-2` → `g__item-2`), `root` reached from Lark's `start`;
//! - a literal as one JSON string per character (`"ing"` → `"i" "n" "g"`): llguidance
//!   lexes greedily, and a several-character lexeme would keep `[a-z]+ "ing"` from ever
//!   producing "singing", which llama.cpp's character-level grammar allows;
//! - a character class or `.` as a regex whose characters are written as code points,
//!   so nothing in them is read as regex syntax.
//!
//! A grammar that is not valid GBNF is an error naming the line and column, for a 400.
//! So is one past the bounds that keep parsing and llguidance's compiler (both recursive)
//! off the end of a thread's stack: [`MAX_NESTING`] parentheses, [`MAX_OPERATORS`]
//! repetition operators on one item, a chain of [`MAX_RULE_DEPTH`] rules each first
//! reached from the one before. Differences from llama.cpp's reading: a rule defined
//! twice is refused (llama.cpp keeps the last), token references (`<[id]>`) are refused,
//! an empty class `[]` is refused and `[^]` is any character.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The largest count a repetition (`{m,n}`) may name: llama.cpp's own limit
/// (`MAX_REPETITION_THRESHOLD`).
pub const MAX_REPEAT: u32 = 2_000;
/// Parentheses inside each other (llguidance refuses more than 30).
pub const MAX_NESTING: usize = 20;
/// Repetition operators on one item (`"a"*?+`).
pub const MAX_OPERATORS: usize = 4;
/// Rules in a chain, each first reached from the one before, from `root`.
pub const MAX_RULE_DEPTH: usize = 100;

/// Why a grammar is not valid GBNF, with where (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (line {line}, column {column})")]
pub struct GbnfError {
    pub message: String,
    pub line: usize,
    pub column: usize,
}

/// The grammar `gbnf` in llguidance's Lark syntax.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let rules = Parser::new(gbnf).grammar()?;
    let mut lark = format!("start: {}\n", rule_name("root"));
    for (name, alternatives) in &rules {
        let _ = write!(lark, "{}: ", rule_name(name));
        write_alternatives(&mut lark, alternatives);
        lark.push('\n');
    }
    Ok(lark)
}

/// One element of a sequence.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Literal(String),
    /// `[...]` (`negated`: `[^...]`): inclusive ranges of characters.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any one character.
    Any,
    Rule(String),
    Group(Vec<Vec<Node>>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
}

/// Alternatives, each a sequence of nodes.
type Alternatives = Vec<Vec<Node>>;

impl Node {
    /// Repetition operators applied to this node, one over the other.
    fn operators(&self) -> usize {
        match self {
            Node::Repeat { node, .. } => 1 + node.operators(),
            _ => 0,
        }
    }

    /// The rules this node names, in order.
    fn rules<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Node::Rule(name) => out.push(name),
            Node::Group(alternatives) => {
                for node in alternatives.iter().flatten() {
                    node.rules(out);
                }
            }
            Node::Repeat { node, .. } => node.rules(out),
            Node::Literal(_) | Node::Class { .. } | Node::Any => {}
        }
    }
}

/// How deep a depth-first walk from `root` goes, each rule entered the first time it
/// is reached (as a compiler that visits each rule once recurses): iterative, so a deep
/// grammar is measured, not followed down the stack.
fn rule_depth(rules: &BTreeMap<String, Alternatives>) -> usize {
    let named = |name: &str| -> Vec<&str> {
        let mut out = Vec::new();
        for node in rules.get(name).into_iter().flatten().flatten() {
            node.rules(&mut out);
        }
        out
    };
    let mut seen = std::collections::HashSet::from(["root"]);
    // Each entry: a rule being walked, with the names it has left to visit.
    let mut stack: Vec<std::vec::IntoIter<&str>> = vec![named("root").into_iter()];
    let mut deepest = 1;
    while let Some(next) = stack.last_mut().map(Iterator::next) {
        match next {
            Some(name) if seen.insert(name) => {
                stack.push(named(name).into_iter());
                deepest = deepest.max(stack.len());
            }
            Some(_) => {}
            None => {
                stack.pop();
            }
        }
    }
    deepest
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    /// Parentheses open at the cursor.
    nesting: usize,
    /// Each referenced rule name, with where it was first used.
    used: BTreeMap<String, usize>,
}

impl Parser {
    fn new(text: &str) -> Self {
        Self {
            chars: text.chars().collect(),
            at: 0,
            nesting: 0,
            used: BTreeMap::new(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn error_at(&self, at: usize, message: impl Into<String>) -> GbnfError {
        let before = &self.chars[..at.min(self.chars.len())];
        let line = before.iter().filter(|&&c| c == '\n').count() + 1;
        let column = before.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        GbnfError {
            message: message.into(),
            line,
            column,
        }
    }

    fn error(&self, message: impl Into<String>) -> GbnfError {
        self.error_at(self.at, message)
    }

    fn grammar(mut self) -> Result<BTreeMap<String, Alternatives>, GbnfError> {
        let mut rules = BTreeMap::new();
        self.space(true);
        while self.peek().is_some() {
            let start = self.at;
            let name = self.name()?;
            self.space(false);
            if !self.eat("::=") {
                return Err(self.error(format!("expected '::=' after the rule name '{name}'")));
            }
            self.space(true);
            let alternatives = self.alternatives(false)?;
            match self.peek() {
                None => {}
                Some('\n') => self.at += 1,
                Some('\r') if self.chars.get(self.at + 1) == Some(&'\n') => self.at += 2,
                Some('\r') => self.at += 1,
                Some(c) => return Err(self.error(format!("unexpected '{c}'"))),
            }
            if rules.insert(name.clone(), alternatives).is_some() {
                return Err(self.error_at(start, format!("the rule '{name}' is defined twice")));
            }
            self.space(true);
        }
        if !rules.contains_key("root") {
            return Err(self.error("the grammar has no 'root' rule"));
        }
        if let Some((name, &at)) = self
            .used
            .iter()
            .find(|(name, _)| !rules.contains_key(*name))
        {
            return Err(self.error_at(at, format!("the rule '{name}' is not defined")));
        }
        if rule_depth(&rules) > MAX_RULE_DEPTH {
            return Err(self.error_at(
                0,
                format!("rules reach each other more than {MAX_RULE_DEPTH} deep from root"),
            ));
        }
        Ok(rules)
    }

    /// Skips blanks and comments; newlines too when `nested` (inside parentheses, or
    /// where a rule cannot end).
    fn space(&mut self, nested: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.at += 1,
                '\r' | '\n' if nested => self.at += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn eat(&mut self, text: &str) -> bool {
        let n = text.chars().count();
        let matches = self.chars.len() >= self.at + n
            && self.chars[self.at..self.at + n]
                .iter()
                .copied()
                .eq(text.chars());
        if matches {
            self.at += n;
        }
        matches
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.at;
        while self.peek().is_some_and(is_word_char) {
            self.at += 1;
        }
        if start == self.at {
            let found = self
                .peek()
                .map_or("the end".to_owned(), |c| format!("'{c}'"));
            return Err(self.error(format!("expected a rule name, found {found}")));
        }
        Ok(self.chars[start..self.at].iter().collect())
    }

    fn alternatives(&mut self, nested: bool) -> Result<Alternatives, GbnfError> {
        let mut alternatives = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.at += 1;
            self.space(true);
            alternatives.push(self.sequence(nested)?);
        }
        Ok(alternatives)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GbnfError> {
        let mut nodes: Vec<Node> = Vec::new();
        while let Some(c) = self.peek() {
            let node = match c {
                '"' => {
                    self.at += 1;
                    let mut text = String::new();
                    while self.peek() != Some('"') {
                        text.push(self.char_in("a literal")?);
                    }
                    self.at += 1;
                    Node::Literal(text)
                }
                '[' => self.class()?,
                '.' => {
                    self.at += 1;
                    Node::Any
                }
                '(' => {
                    if self.nesting == MAX_NESTING {
                        return Err(self.error(format!(
                            "more than {MAX_NESTING} parentheses inside each other"
                        )));
                    }
                    self.at += 1;
                    self.nesting += 1;
                    self.space(true);
                    let alternatives = self.alternatives(true)?;
                    if self.peek() != Some(')') {
                        return Err(self.error("expected ')'"));
                    }
                    self.at += 1;
                    self.nesting -= 1;
                    Node::Group(alternatives)
                }
                '<' => return Err(self.error("token references (<...>) are not served")),
                '*' | '+' | '?' | '{' => {
                    let Some(last) = nodes.pop() else {
                        return Err(self.error(format!("'{c}' follows nothing it could repeat")));
                    };
                    if last.operators() == MAX_OPERATORS {
                        return Err(self.error(format!(
                            "more than {MAX_OPERATORS} repetition operators on one item"
                        )));
                    }
                    let (min, max) = self.repeat(nested)?;
                    Node::Repeat {
                        node: Box::new(last),
                        min,
                        max,
                    }
                }
                c if is_word_char(c) => {
                    let at = self.at;
                    let name = self.name()?;
                    self.used.entry(name.clone()).or_insert(at);
                    Node::Rule(name)
                }
                _ => break,
            };
            nodes.push(node);
            self.space(nested);
        }
        Ok(nodes)
    }

    /// A repetition operator at the cursor: `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`.
    fn repeat(&mut self, nested: bool) -> Result<(u32, Option<u32>), GbnfError> {
        let op = self.peek();
        self.at += 1;
        Ok(match op {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            _ => {
                self.space(nested);
                let min = self.count()?;
                self.space(nested);
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.at += 1;
                        self.space(nested);
                        let max = match self.peek() {
                            Some(c) if c.is_ascii_digit() => Some(self.count()?),
                            _ => None,
                        };
                        self.space(nested);
                        if self.peek() != Some('}') {
                            return Err(self.error("expected '}'"));
                        }
                        max
                    }
                    _ => return Err(self.error("expected ',' or '}'")),
                };
                self.at += 1;
                if let Some(max) = max.filter(|&max| max < min) {
                    return Err(self.error(format!("{{{min},{max}}}: the most is below the least")));
                }
                (min, max)
            }
        })
    }

    fn count(&mut self) -> Result<u32, GbnfError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return Err(self.error("expected a number"));
        }
        let digits: String = self.chars[start..self.at].iter().collect();
        digits
            .parse::<u32>()
            .ok()
            .filter(|&n| n <= MAX_REPEAT)
            .ok_or_else(|| {
                self.error_at(start, format!("a repetition count is at most {MAX_REPEAT}"))
            })
    }

    fn class(&mut self) -> Result<Node, GbnfError> {
        let start = self.at;
        self.at += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        while self.peek() != Some(']') {
            let low = self.char_in("a character class")?;
            let high = if self.peek() == Some('-') && self.chars.get(self.at + 1) != Some(&']') {
                self.at += 1;
                self.char_in("a character class")?
            } else {
                low
            };
            if high < low {
                return Err(self.error(format!("the range {low}-{high} is empty")));
            }
            ranges.push((low, high));
        }
        self.at += 1;
        if ranges.is_empty() && !negated {
            return Err(self.error_at(start, "an empty character class matches nothing"));
        }
        Ok(Node::Class { negated, ranges })
    }

    /// One character of a literal or class, escapes read as llama.cpp reads them.
    fn char_in(&mut self, what: &str) -> Result<char, GbnfError> {
        let Some(c) = self.peek() else {
            return Err(self.error(format!("the input ends inside {what}")));
        };
        self.at += 1;
        if c != '\\' {
            return Ok(c);
        }
        let escape_at = self.at - 1;
        let Some(e) = self.peek() else {
            return Err(self.error(format!("the input ends inside {what}")));
        };
        self.at += 1;
        let digits = match e {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            't' => return Ok('\t'),
            'r' => return Ok('\r'),
            'n' => return Ok('\n'),
            '\\' | '"' | '[' | ']' => return Ok(e),
            _ => return Err(self.error_at(escape_at, format!("unknown escape '\\{e}'"))),
        };
        let end = (self.at + digits).min(self.chars.len());
        let hex: String = self.chars[self.at..end].iter().collect();
        self.at = end;
        u32::from_str_radix(&hex, 16)
            .ok()
            .filter(|_| hex.len() == digits && hex.chars().all(|c| c.is_ascii_hexdigit()))
            .and_then(char::from_u32)
            .ok_or_else(|| self.error_at(escape_at, format!("'\\{e}{hex}' is not a character")))
    }
}

/// llama.cpp's rule-name characters.
fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

/// A GBNF rule name as a Lark rule name: lowercase with a prefix; an uppercase letter is
/// `_` and the letter, so no two GBNF names meet.
fn rule_name(gbnf: &str) -> String {
    let mut name = String::from("g_");
    for c in gbnf.chars() {
        if c.is_ascii_uppercase() {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}

fn write_alternatives(out: &mut String, alternatives: &[Vec<Node>]) {
    for (i, sequence) in alternatives.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        if sequence.is_empty() {
            out.push_str("\"\"");
        }
        for (j, node) in sequence.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            write_node(out, node);
        }
    }
}

fn write_node(out: &mut String, node: &Node) {
    match node {
        Node::Literal(text) => write_literal(out, text),
        Node::Class { negated, ranges } if *negated && ranges.is_empty() => {
            out.push_str("/(?s:.)/");
        }
        Node::Class { negated, ranges } => {
            out.push_str(if *negated { "/[^" } else { "/[" });
            for &(low, high) in ranges {
                write_class_char(out, low);
                if high != low {
                    out.push('-');
                    write_class_char(out, high);
                }
            }
            out.push_str("]/");
        }
        Node::Any => out.push_str("/(?s:.)/"),
        Node::Rule(name) => out.push_str(&rule_name(name)),
        Node::Group(alternatives) => {
            out.push('(');
            write_alternatives(out, alternatives);
            out.push(')');
        }
        Node::Repeat { node, min, max } => {
            // Lark refuses `{0}`: repeating nothing is the empty string.
            if *max == Some(0) {
                out.push_str("\"\"");
                return;
            }
            // A repeat of a repeat (`"a"*?`), and of a literal of several characters
            // (written as one string per character), needs its own parentheses; any
            // other node is one Lark atom already.
            let nested = match &**node {
                Node::Repeat { .. } => true,
                Node::Literal(text) => text.chars().nth(1).is_some(),
                _ => false,
            };
            if nested {
                out.push('(');
            }
            write_node(out, node);
            if nested {
                out.push(')');
            }
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (min, None) => {
                    let _ = write!(out, "{{{min},}}");
                }
                (min, Some(max)) => {
                    let _ = write!(out, "{{{min},{max}}}");
                }
            }
        }
    }
}

/// A literal as one JSON string per character (see the module's notes), which Lark
/// reads; DEL, which JSON leaves bare and Lark refuses, as an escape. The empty literal
/// is `""`.
fn write_literal(out: &mut String, text: &str) {
    if text.is_empty() {
        out.push_str("\"\"");
    }
    for (i, c) in text.chars().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let json = serde_json::Value::String(c.to_string()).to_string();
        out.push_str(&json.replace('\u{7f}', "\\u007f"));
    }
}

/// A character inside a regex class: letters and digits as they are, anything else as
/// its code point, so `]`, `-`, `\`, `^` and `/` never read as syntax.
fn write_class_char(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    }
}

#[cfg(test)]
mod tests;
