//! AWS's evaluation within one account: condition operators and keys, ARN and glob matching, the
//! decision (an explicit deny wins; otherwise allowed iff some statement allows).

use super::*;

/// Condition keys of a request. A key is either known (with its values, or known to be absent) or
/// not modelled by this module, and a condition on an unmodelled key is an error: never a guess.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    pub(crate) values: BTreeMap<String, Vec<String>>,
    pub(crate) modelled: BTreeSet<String>,
}

/// Keys that carry a set of values (conditions on them need `ForAllValues:` or `ForAnyValue:`).
pub(crate) const MULTIVALUED: &[&str] = &[
    "dynamodb:leadingkeys",
    "dynamodb:attributes",
    "aws:tagkeys",
    "aws:calledvia",
];

impl Context {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.set_all(key, [value.into()]);
    }

    pub fn set_all(&mut self, key: &str, values: impl IntoIterator<Item = String>) {
        let key = key.to_ascii_lowercase();
        self.values
            .insert(key.clone(), values.into_iter().collect());
        self.modelled.insert(key);
    }

    /// Known to be absent from the request.
    pub fn absent(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.values.remove(&key);
        self.modelled.insert(key);
    }

    /// The key's values (`None`: absent), or an error for a key not modelled.
    pub(crate) fn get(&self, key: &str) -> Result<Option<&[String]>, String> {
        match self.values.get(key) {
            Some(values) if !values.is_empty() => Ok(Some(values)),
            _ if self.modelled.contains(key) => Ok(None),
            _ => Err(format!(
                "condition key {key} is not modelled by the IAM checker for this request"
            )),
        }
    }

    /// The service's keys (not the global `aws:` ones) that have values, for reports.
    pub fn service_keys(&self) -> Vec<(String, Vec<String>)> {
        self.values
            .iter()
            .filter(|(k, v)| !k.starts_with("aws:") && !v.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

pub(crate) const OPERATORS: &[&str] = &[
    "StringEquals",
    "StringNotEquals",
    "StringEqualsIgnoreCase",
    "StringNotEqualsIgnoreCase",
    "StringLike",
    "StringNotLike",
    "ArnEquals",
    "ArnLike",
    "ArnNotEquals",
    "ArnNotLike",
    "Bool",
    "NumericEquals",
    "NumericNotEquals",
    "NumericLessThan",
    "NumericLessThanEquals",
    "NumericGreaterThan",
    "NumericGreaterThanEquals",
];

/// A negated operator holds when the key is absent (AWS: "if the key is not present, a negated
/// operator such as StringNotLike returns true").
pub(crate) fn negated(operator: &str) -> bool {
    operator.contains("Not")
}

impl Condition {
    pub(crate) fn holds(&self, context: &Context) -> Result<bool, String> {
        enum Set {
            All,
            Any,
        }
        let (set, rest) = if let Some(rest) = self.operator.strip_prefix("ForAllValues:") {
            (Some(Set::All), rest)
        } else if let Some(rest) = self.operator.strip_prefix("ForAnyValue:") {
            (Some(Set::Any), rest)
        } else {
            (None, self.operator.as_str())
        };
        let (operator, if_exists) = match rest.strip_suffix("IfExists") {
            Some(operator) => (operator, true),
            None => (rest, false),
        };
        if operator == "Null" {
            if set.is_some() || if_exists {
                return Err(format!("{} is not a valid operator", self.operator));
            }
            let absent = match &self.values[..] {
                [v] if v.eq_ignore_ascii_case("true") => true,
                [v] if v.eq_ignore_ascii_case("false") => false,
                other => return Err(format!("Null {}: {other:?}", self.key)),
            };
            return Ok(context.get(&self.key)?.is_none() == absent);
        }
        if !OPERATORS.contains(&operator) {
            return Err(format!(
                "condition operator {} is not implemented by the IAM checker",
                self.operator
            ));
        }
        let values = context.get(&self.key)?;
        match set {
            None => {
                if MULTIVALUED.contains(&self.key.as_str()) {
                    return Err(format!(
                        "{} is multivalued: its condition needs ForAllValues: or ForAnyValue:",
                        self.key
                    ));
                }
                match values {
                    None => Ok(if_exists || negated(operator)),
                    Some([value]) => test(operator, value, &self.values),
                    Some(many) => Err(format!("{} has several values: {many:?}", self.key)),
                }
            }
            // True for an absent key or an empty set.
            Some(Set::All) => values
                .unwrap_or_default()
                .iter()
                .try_fold(true, |ok, v| Ok(ok && test(operator, v, &self.values)?)),
            // False for an absent key or an empty set.
            Some(Set::Any) => match values {
                None => Ok(if_exists),
                Some(values) => values
                    .iter()
                    .try_fold(false, |ok, v| Ok(ok || test(operator, v, &self.values)?)),
            },
        }
    }
}

/// One value of the request against the condition's values (any of them matching).
pub(crate) fn test(operator: &str, value: &str, policy: &[String]) -> Result<bool, String> {
    let any = |f: &dyn Fn(&str) -> bool| policy.iter().any(|p| f(p));
    let numeric = |p: &str| -> Result<f64, String> {
        p.parse::<f64>()
            .map_err(|_| format!("{operator}: {p} is not a number"))
    };
    let number = value.parse::<f64>().ok();
    let compare = |f: fn(f64, f64) -> bool| -> Result<bool, String> {
        let mut out = false;
        for p in policy {
            let p = numeric(p)?;
            out |= number.is_some_and(|n| f(n, p));
        }
        Ok(out)
    };
    Ok(match operator {
        "StringEquals" => any(&|p| p == value),
        "StringNotEquals" => !any(&|p| p == value),
        "StringEqualsIgnoreCase" => any(&|p| p.to_lowercase() == value.to_lowercase()),
        "StringNotEqualsIgnoreCase" => !any(&|p| p.to_lowercase() == value.to_lowercase()),
        "StringLike" => any(&|p| glob(p, value, false)),
        "StringNotLike" => !any(&|p| glob(p, value, false)),
        "ArnEquals" | "ArnLike" => any(&|p| arn_like(p, value)),
        "ArnNotEquals" | "ArnNotLike" => !any(&|p| arn_like(p, value)),
        "Bool" => {
            if let Some(p) = policy
                .iter()
                .find(|p| !p.eq_ignore_ascii_case("true") && !p.eq_ignore_ascii_case("false"))
            {
                return Err(format!("Bool: {p} is not true or false"));
            }
            any(&|p| p.eq_ignore_ascii_case(value))
        }
        "NumericEquals" => compare(|a, b| a == b)?,
        "NumericNotEquals" => !compare(|a, b| a == b)?,
        "NumericLessThan" => compare(|a, b| a < b)?,
        "NumericLessThanEquals" => compare(|a, b| a <= b)?,
        "NumericGreaterThan" => compare(|a, b| a > b)?,
        "NumericGreaterThanEquals" => compare(|a, b| a >= b)?,
        other => return Err(format!("condition operator {other} is not implemented")),
    })
}

/// `*` (any run of characters) and `?` (one character) wildcards.
pub fn glob(pattern: &str, text: &str, ignore_case: bool) -> bool {
    let fold = |c: char| {
        if ignore_case {
            c.to_ascii_lowercase()
        } else {
            c
        }
    };
    let p: Vec<char> = pattern.chars().map(fold).collect();
    let t: Vec<char> = text.chars().map(fold).collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        // A `*` in the pattern is a wildcard even where the text holds a `*` too.
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if let Some((s, mark)) = star {
            pi = s + 1;
            ti = mark + 1;
            star = Some((s, mark + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// ArnLike/ArnEquals: each of the six colon-separated parts matched on its own, wildcards allowed.
pub(crate) fn arn_like(pattern: &str, arn: &str) -> bool {
    match (arn_parts(pattern), arn_parts(arn)) {
        (Some(p), Some(a)) => p.iter().zip(a.iter()).all(|(p, a)| glob(p, a, false)),
        _ => false,
    }
}

// -------------------------------------------------------------------------------------- evaluation

/// One authorization IAM makes for a call (a batch or transaction makes one per table and action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub action: String,
    pub resource: String,
    pub context: Context,
    /// A Secrets Manager secret outside the stack named by name, not ARN: its ARN is `resource` plus
    /// `-` and six characters the request does not tell (matched by a policy naming that ARN, or a
    /// pattern any such suffix satisfies).
    pub(crate) secret_by_name: bool,
}

impl Request {
    pub fn new(action: impl Into<String>, resource: impl Into<String>, context: Context) -> Self {
        Self {
            action: action.into(),
            resource: resource.into(),
            context,
            secret_by_name: false,
        }
    }

    pub(crate) fn resource_matches(&self, pattern: &str) -> bool {
        if glob(pattern, &self.resource, false) {
            return true;
        }
        if !self.secret_by_name {
            return false;
        }
        // The secret's full ARN: a literal one with this name, or a pattern that any six-character
        // suffix satisfies (probed with one).
        let prefix = format!("{}-", self.resource);
        let literal = !pattern.contains(['*', '?'])
            && pattern.len() == prefix.len() + 6
            && pattern.starts_with(&prefix);
        literal || glob(pattern, &format!("{prefix}AbCdEf"), false)
    }
}

/// What IAM decides for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// No statement allows it.
    ImplicitDeny,
    /// A Deny statement matches: its policy and its Sid (or `statement <n>`).
    ExplicitDeny {
        policy: String,
        statement: String,
    },
}

impl Decision {
    /// AWS's wording, more or less.
    pub fn reason(&self) -> String {
        match self {
            Decision::Allowed => "allowed".into(),
            Decision::ImplicitDeny => {
                "no identity-based or resource-based policy allows the action".into()
            }
            Decision::ExplicitDeny { policy, statement } => {
                format!("explicit deny in {policy} ({statement})")
            }
        }
    }
}

/// Evaluates `request` made by `principal` as IAM does within one account: a matching Deny in any
/// identity or resource statement denies; otherwise a matching Allow in either allows; otherwise the
/// request is implicitly denied. A statement that cannot be evaluated (an unmodelled key or operator)
/// is an error unless a Deny already decides.
pub fn evaluate(principal: &Principal, request: &Request) -> Result<Decision, String> {
    let mut context = request.context.clone();
    context.set("aws:PrincipalArn", principal.role_arn.clone());
    context.set("aws:PrincipalAccount", principal.account.clone());
    let resource_statements = principal
        .resource_policies
        .iter()
        .filter(|policy| {
            policy
                .governs
                .iter()
                .any(|pattern| request.resource_matches(pattern))
        })
        .flat_map(|policy| &policy.statements);
    let mut allowed = false;
    let mut error = None;
    for statement in principal.statements.iter().chain(resource_statements) {
        match statement.matches(request, &context) {
            Ok(false) => {}
            Ok(true) if statement.effect == Effect::Deny => {
                return Ok(Decision::ExplicitDeny {
                    policy: statement.policy.clone(),
                    statement: statement.label.clone(),
                })
            }
            Ok(true) => allowed = true,
            Err(e) => {
                error.get_or_insert_with(|| {
                    format!("{} ({}): {e}", statement.policy, statement.label)
                });
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None if allowed => Ok(Decision::Allowed),
        None => Ok(Decision::ImplicitDeny),
    }
}

// ------------------------------------------------------------------------------- reading a request
