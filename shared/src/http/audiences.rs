//! Who an endpoint serves: each function URL of the template serves one audience's routes.

/// Who a route is for. A deployment gives each audience a function URL of its own (`API_AUDIENCES`
/// names what a function serves), so that IAM on each URL separates submitting from operating from
/// administering releases.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, strum::IntoStaticStr, strum::Display,
)]
#[strum(serialize_all = "lowercase")]
pub enum Audience {
    /// Submit executions; read executions, their results and history, and releases.
    Submit,
    /// Cancel and re-drive executions; list (with their resume tokens) and complete interactions.
    Operate,
    /// Register releases and activate them.
    Administer,
}

impl Audience {
    pub const ALL: [Audience; 3] = [Audience::Submit, Audience::Operate, Audience::Administer];

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The audiences one endpoint serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audiences([bool; 3]);

impl Audiences {
    /// Every route (a local endpoint, tests).
    pub const ALL: Audiences = Audiences([true; 3]);

    pub fn only(audience: Audience) -> Self {
        let mut served = [false; 3];
        served[audience as usize] = true;
        Self(served)
    }

    pub fn serves(&self, audience: Audience) -> bool {
        self.0[audience as usize]
    }

    /// What an endpoint serves, from its `API_AUDIENCES` setting: an endpoint that was not told
    /// serves nothing (it fails to start) rather than every route, so that a function deployed
    /// without the setting does not make each of its callers an administrator.
    pub fn configured(setting: Option<&str>) -> Result<Self, String> {
        match setting {
            Some(text) => Self::parse(text),
            None => Err("API_AUDIENCES is not set: name what this endpoint serves \
                 (submit, operate, administer, or all)"
                .into()),
        }
    }

    /// From `API_AUDIENCES`' form: names separated by commas (`submit,operate`), or `all`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut served = [false; 3];
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "all" {
                return Ok(Self::ALL);
            }
            let audience = Audience::ALL
                .into_iter()
                .find(|a| a.as_str() == name)
                .ok_or_else(|| {
                    format!("unknown audience {name:?} (submit, operate, administer or all)")
                })?;
            served[audience as usize] = true;
        }
        if served == [false; 3] {
            return Err("no audience named (submit, operate, administer or all)".into());
        }
        Ok(Self(served))
    }
}

impl std::fmt::Display for Audiences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = Audience::ALL
            .into_iter()
            .filter(|a| self.serves(*a))
            .map(Audience::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

// ------------------------------------------------------------------------------------------ routes
