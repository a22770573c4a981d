//! The central manager's state as a table for people: its groups with the
//! host that manages each, and every host with its state, since when,
//! what its health check said, and the actions taken on it.

use serde_json::Value;

/// The table of a status reply (the central manager's JSON).
pub fn table(json: &str) -> Result<String, serde_json::Error> {
    let v: Value = serde_json::from_str(json)?;
    let mut out = String::new();
    out += "group      manager    epoch\n";
    for g in v["groups"].as_array().into_iter().flatten() {
        out += &format!(
            "{:<10} {:<10} {}\n",
            g["name"].as_str().unwrap_or("?"),
            g["manager"].as_str().unwrap_or("-"),
            g["epoch"].as_u64().map_or("-".into(), |e| e.to_string()),
        );
    }
    out += "\nhost       group      state      since                 actions  why\n";
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for (name, h) in v["hosts"].as_object().into_iter().flatten() {
        let since = h["since"].as_u64().unwrap_or(0);
        let ago = now.saturating_sub(since) / 1_000_000_000;
        let actions: Vec<String> = h["actions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.get(1)?.as_str().map(str::to_string))
            .collect();
        let mut why = h["reason"].as_str().unwrap_or("").to_string();
        if let Some(health) = h["health"].as_str() {
            why = format!("{why} [health: {health}]");
        }
        out += &format!(
            "{:<10} {:<10} {:<10} {:<21} {:<8} {}\n",
            name,
            h["group"].as_str().unwrap_or("?"),
            h["state"].as_str().unwrap_or("?"),
            format!("{ago} s ago"),
            if actions.is_empty() {
                "-".into()
            } else {
                actions.join(",")
            },
            why
        );
    }
    Ok(out)
}
