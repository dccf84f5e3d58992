//! The parsed form of an expression.

use crate::cast::Target;
use crate::datum::Datum;
use crate::func::Func;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// A column of the row (case-folded as PostgreSQL would).
    Column(String),
    /// A string constant or NULL, of type `unknown` until its context types it.
    Lit(Option<String>),
    /// A numeric constant as written (with a leading `-` when negated).
    Number(String),
    /// A typed constant (`true`, or a column-free part evaluated at load).
    Const(Datum),
    Cast(Box<Node>, Target),
    Neg(Box<Node>),
    Plus(Box<Node>),
    Concat(Box<Node>, Box<Node>),
    /// `->` (`text: false`) or `->>` (`text: true`).
    Arrow {
        text: bool,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// `#>` or `#>>`.
    Path {
        text: bool,
        left: Box<Node>,
        right: Box<Node>,
    },
    Compare(CmpOp, Box<Node>, Box<Node>),
    Like {
        expr: Box<Node>,
        pattern: Box<Node>,
        escape: Option<Box<Node>>,
        negated: bool,
        ilike: bool,
    },
    In {
        expr: Box<Node>,
        list: Vec<Node>,
        negated: bool,
    },
    IsNull(Box<Node>, bool),
    /// `IS [NOT] TRUE|FALSE|UNKNOWN` (`None` is UNKNOWN).
    IsBool {
        expr: Box<Node>,
        what: Option<bool>,
        negated: bool,
    },
    Not(Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Case {
        operand: Option<Box<Node>>,
        whens: Vec<(Node, Node)>,
        otherwise: Option<Box<Node>>,
    },
    Coalesce(Vec<Node>),
    NullIf(Box<Node>, Box<Node>),
    Call(Func, Vec<Node>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "=",
            CmpOp::Ne => "<>",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }

    pub(crate) fn from_symbol(s: &str) -> Option<CmpOp> {
        Some(match s {
            "=" => CmpOp::Eq,
            "<>" => CmpOp::Ne,
            "<" => CmpOp::Lt,
            "<=" => CmpOp::Le,
            ">" => CmpOp::Gt,
            ">=" => CmpOp::Ge,
            _ => return None,
        })
    }
}

impl Node {
    /// Its direct children.
    pub(crate) fn kids(&self) -> Vec<&Node> {
        let mut out = Vec::new();
        collect_children(self, &mut out);
        out
    }

    /// The columns it reads, each once, in order of appearance.
    pub(crate) fn columns<'a>(&'a self, out: &mut Vec<&'a str>) {
        if let Node::Column(c) = self {
            if !out.contains(&c.as_str()) {
                out.push(c);
            }
            return;
        }
        for k in self.kids() {
            k.columns(out);
        }
    }
}

fn collect_children<'a>(n: &'a Node, out: &mut Vec<&'a Node>) {
    match n {
        Node::Column(_) | Node::Lit(_) | Node::Number(_) | Node::Const(_) => {}
        Node::Cast(e, _) | Node::Neg(e) | Node::Plus(e) | Node::Not(e) | Node::IsNull(e, _) => {
            out.push(e)
        }
        Node::IsBool { expr, .. } => out.push(expr),
        Node::Concat(a, b)
        | Node::Compare(_, a, b)
        | Node::And(a, b)
        | Node::Or(a, b)
        | Node::NullIf(a, b)
        | Node::Arrow {
            left: a, right: b, ..
        }
        | Node::Path {
            left: a, right: b, ..
        } => {
            out.push(a);
            out.push(b);
        }
        Node::Like {
            expr,
            pattern,
            escape,
            ..
        } => {
            out.push(expr);
            out.push(pattern);
            if let Some(e) = escape {
                out.push(e);
            }
        }
        Node::In { expr, list, .. } => {
            out.push(expr);
            out.extend(list);
        }
        Node::Case {
            operand,
            whens,
            otherwise,
        } => {
            if let Some(o) = operand {
                out.push(o);
            }
            for (w, t) in whens {
                out.push(w);
                out.push(t);
            }
            if let Some(o) = otherwise {
                out.push(o);
            }
        }
        Node::Coalesce(args) | Node::Call(_, args) => out.extend(args),
    }
}
