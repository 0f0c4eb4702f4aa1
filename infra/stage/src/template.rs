//! Reads template.yaml: parameters, resources and the intrinsic functions the local stack needs
//! (`!Ref`, `!GetAtt`, `!Sub`), resolved against the resources it provisioned.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde_yaml_ng::Value;

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    pub root: Value,
}

impl Template {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Self> {
        let root: Value = serde_yaml_ng::from_str(text).context("parsing the template")?;
        if !root.get("Resources").is_some_and(Value::is_mapping) {
            bail!("the template has no Resources");
        }
        Ok(Self { root })
    }

    /// The project's template as it was when this binary was built (for tools run away from the repo).
    pub fn embedded() -> Self {
        Self::parse(include_str!("../../../template.yaml")).expect("the project's template parses")
    }

    /// The template next to the workspace root (this crate lives in infra/stage).
    pub fn default_path() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml")
    }

    /// Resources as (logical id, type, properties), in template order.
    pub fn resources(&self) -> Vec<(String, String, Value)> {
        let Some(map) = self.root.get("Resources").and_then(Value::as_mapping) else {
            return Vec::new();
        };
        map.iter()
            .filter_map(|(id, body)| {
                Some((
                    id.as_str()?.to_string(),
                    body.get("Type")?.as_str()?.to_string(),
                    body.get("Properties").cloned().unwrap_or(Value::Null),
                ))
            })
            .collect()
    }

    /// Parameter defaults.
    pub fn parameter_defaults(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(map) = self.root.get("Parameters").and_then(Value::as_mapping) {
            for (name, body) in map {
                if let (Some(name), Some(default)) = (name.as_str(), body.get("Default")) {
                    if let Some(text) = scalar(default) {
                        out.insert(name.to_string(), text);
                    }
                }
            }
        }
        out
    }

    /// A property every function gets unless it sets its own (Globals.Function.<key>).
    pub fn global_function_property(&self, key: &str) -> Option<&Value> {
        self.root.get("Globals")?.get("Function")?.get(key)
    }

    /// A property of function `logical`: its own, else the global one.
    pub fn function_property(&self, logical: &str, key: &str) -> Option<Value> {
        let own = self
            .root
            .get("Resources")?
            .get(logical)?
            .get("Properties")
            .and_then(|props| props.get(key));
        own.or_else(|| self.global_function_property(key)).cloned()
    }

    /// Environment variables every function gets (Globals.Function.Environment.Variables).
    pub fn global_env(&self) -> Option<&Value> {
        self.global_function_property("Environment")?
            .get("Variables")
    }
}

/// A plain scalar as text.
pub fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// What intrinsic functions resolve against.
pub trait Lookup {
    fn parameter(&self, name: &str) -> Option<String>;
    /// `!Ref` of a resource (table name, queue URL, bus name).
    fn reference(&self, logical: &str) -> Option<String>;
    /// `!GetAtt logical.attribute`.
    fn attribute(&self, logical: &str, attribute: &str) -> Option<String>;
    /// `Fn::ImportValue name`: another stack's export.
    fn import(&self, _name: &str) -> Option<String> {
        None
    }
}

/// A lookup whose `!Sub` variables (the list form's map) come before `inner`'s parameters.
struct WithVariables<'a> {
    variables: BTreeMap<String, String>,
    inner: &'a dyn Lookup,
}

impl Lookup for WithVariables<'_> {
    fn parameter(&self, name: &str) -> Option<String> {
        self.variables
            .get(name)
            .cloned()
            .or_else(|| self.inner.parameter(name))
    }
    fn reference(&self, logical: &str) -> Option<String> {
        self.inner.reference(logical)
    }
    fn attribute(&self, logical: &str, attribute: &str) -> Option<String> {
        self.inner.attribute(logical, attribute)
    }
    fn import(&self, name: &str) -> Option<String> {
        self.inner.import(name)
    }
}

/// Resolves a value that may be a scalar or an intrinsic function to text.
pub fn resolve(value: &Value, lookup: &dyn Lookup) -> Result<String> {
    if let Some(text) = scalar(value) {
        return Ok(text);
    }
    let (function, argument) = match value {
        Value::Tagged(tagged) => (
            tagged.tag.to_string().trim_start_matches('!').to_string(),
            tagged.value.clone(),
        ),
        Value::Mapping(map) if map.len() == 1 => {
            let (k, v) = map.iter().next().expect("one entry");
            let name = k.as_str().unwrap_or_default();
            (name.trim_start_matches("Fn::").to_string(), v.clone())
        }
        other => bail!("cannot resolve {other:?}"),
    };
    match function.as_str() {
        "Ref" => {
            let name = scalar(&argument).ok_or_else(|| anyhow!("!Ref needs a name"))?;
            lookup
                .parameter(&name)
                .or_else(|| lookup.reference(&name))
                .ok_or_else(|| anyhow!("!Ref {name}: unknown parameter or resource"))
        }
        "GetAtt" => {
            let (logical, attribute) = match &argument {
                Value::Sequence(parts) if parts.len() == 2 => (
                    scalar(&parts[0]).unwrap_or_default(),
                    scalar(&parts[1]).unwrap_or_default(),
                ),
                other => {
                    let text = scalar(other).unwrap_or_default();
                    let (l, a) = text
                        .split_once('.')
                        .ok_or_else(|| anyhow!("!GetAtt {text}: expected Logical.Attribute"))?;
                    (l.to_string(), a.to_string())
                }
            };
            lookup
                .attribute(&logical, &attribute)
                .ok_or_else(|| anyhow!("!GetAtt {logical}.{attribute}: unknown"))
        }
        "Sub" => match &argument {
            // `!Sub [text, {name: value}]`: the names are variables of the text.
            Value::Sequence(parts) if parts.len() == 2 => {
                let text = scalar(&parts[0]).ok_or_else(|| anyhow!("!Sub needs a string"))?;
                let mut variables = BTreeMap::new();
                for (name, value) in parts[1].as_mapping().into_iter().flatten() {
                    let name = scalar(name).ok_or_else(|| anyhow!("!Sub: a variable's name"))?;
                    variables.insert(name, resolve(value, lookup)?);
                }
                substitute(
                    &text,
                    &WithVariables {
                        variables,
                        inner: lookup,
                    },
                )
            }
            _ => {
                let text = scalar(&argument).ok_or_else(|| anyhow!("!Sub needs a string"))?;
                substitute(&text, lookup)
            }
        },
        "ImportValue" => {
            let name = resolve(&argument, lookup)?;
            lookup
                .import(&name)
                .ok_or_else(|| anyhow!("Fn::ImportValue {name}: no such export"))
        }
        other => bail!("intrinsic function {other} is not supported by the local stack"),
    }
}

fn substitute(text: &str, lookup: &dyn Lookup) -> Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .ok_or_else(|| anyhow!("unclosed ${{ in {text:?}"))?
            + start;
        let name = &rest[start + 2..end];
        let value = match name.split_once('.') {
            Some((logical, attribute)) => lookup.attribute(logical, attribute),
            None => lookup.parameter(name).or_else(|| lookup.reference(name)),
        }
        .ok_or_else(|| anyhow!("!Sub: unknown ${{{name}}}"))?;
        out.push_str(&value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Lookup for Fixed {
        fn parameter(&self, name: &str) -> Option<String> {
            (name == "Stage").then(|| "t1".to_string())
        }
        fn reference(&self, logical: &str) -> Option<String> {
            (logical == "Q").then(|| "http://q".to_string())
        }
        fn attribute(&self, logical: &str, attribute: &str) -> Option<String> {
            (logical == "Q" && attribute == "Arn").then(|| "arn:q".to_string())
        }
    }

    fn value(text: &str) -> Value {
        serde_yaml_ng::from_str(text).unwrap()
    }

    #[test]
    fn resolves_intrinsics() {
        assert_eq!(resolve(&value("!Ref Q"), &Fixed).unwrap(), "http://q");
        assert_eq!(resolve(&value("!Ref Stage"), &Fixed).unwrap(), "t1");
        assert_eq!(resolve(&value("!GetAtt Q.Arn"), &Fixed).unwrap(), "arn:q");
        assert_eq!(
            resolve(&value("{'Fn::GetAtt': [Q, Arn]}"), &Fixed).unwrap(),
            "arn:q"
        );
        assert_eq!(
            resolve(&value("!Sub 'x-${Stage}-y'"), &Fixed).unwrap(),
            "x-t1-y"
        );
        assert_eq!(resolve(&value("5"), &Fixed).unwrap(), "5");
        assert!(resolve(&value("!Ref Nope"), &Fixed).is_err());
    }

    #[test]
    fn resolves_the_list_form_of_sub_and_imports() {
        struct Importing;
        impl Lookup for Importing {
            fn parameter(&self, name: &str) -> Option<String> {
                Fixed.parameter(name)
            }
            fn reference(&self, logical: &str) -> Option<String> {
                Fixed.reference(logical)
            }
            fn attribute(&self, logical: &str, attribute: &str) -> Option<String> {
                Fixed.attribute(logical, attribute)
            }
            fn import(&self, name: &str) -> Option<String> {
                (name == "core-t1-Bucket").then(|| "the-bucket".to_string())
            }
        }
        let imported = "{'Fn::ImportValue': !Sub 'core-${Stage}-Bucket'}";
        assert_eq!(resolve(&value(imported), &Importing).unwrap(), "the-bucket");
        let sub = format!("!Sub ['arn:${{B}}/${{Stage}}/*', {{B: {imported}}}]");
        assert_eq!(
            resolve(&value(&sub), &Importing).unwrap(),
            "arn:the-bucket/t1/*"
        );
        assert!(resolve(&value("{'Fn::ImportValue': nope}"), &Importing).is_err());
        assert!(resolve(&value(imported), &Fixed).is_err(), "no exports");
    }

    #[test]
    fn reads_the_project_template() {
        let template = Template::load(&Template::default_path()).unwrap();
        let kinds: Vec<String> = template.resources().into_iter().map(|r| r.1).collect();
        assert!(kinds.iter().any(|k| k == "AWS::DynamoDB::Table"));
        assert!(kinds.iter().any(|k| k == "AWS::SQS::Queue"));
        assert!(kinds.iter().any(|k| k == "AWS::Serverless::Function"));
        assert_eq!(template.parameter_defaults()["DueShards"], "4");
    }
}
