//! Doctor's check of each projection's definition against the one its live subscriber
//! folded with (what `walfold run` decides about at start, by `on_definition_change`).

use tokio_postgres::Client;
use walfold_config::{
    definition_diff, short_digest, Config, FoldDefinition, OnDefinitionChange, ProjectionConfig,
};
use walfold_engine::Target;
use walfold_store::definition::{self, RecordedDefinition};
use walfold_store::{rebuild, RebuildState, StoreError};

use super::finding::Finding;

/// One finding per projection of `home`.
pub(super) async fn checks(
    config: &Config,
    home: &Target,
    client: &Client,
) -> Result<Vec<Finding>, StoreError> {
    let schema = &home.schema;
    // A schema walfold has not created yet has nothing recorded.
    let Ok(active) = walfold_store::active_projections(client, schema).await else {
        return Ok(Vec::new());
    };
    let open = rebuild::open(client, schema).await.unwrap_or_default();
    let mut found = Vec::new();
    for p in config
        .projection
        .iter()
        .filter(|p| Target::of(config, p) == *home)
    {
        let subscriber = active
            .iter()
            .find(|(name, _)| *name == p.name)
            .map_or(p.subscriber.as_str(), |(_, s)| s.as_str());
        let recorded = definition::recorded(client, schema, subscriber).await?;
        let running = match open
            .iter()
            .find(|r| r.projection == p.name && r.state == RebuildState::Running)
        {
            Some(r) => definition::recorded(client, schema, &r.subscriber)
                .await?
                .map(|d| (r.subscriber.clone(), d)),
            None => None,
        };
        found.push(finding(p, subscriber, recorded.as_ref(), running.as_ref()));
    }
    Ok(found)
}

fn finding(
    p: &ProjectionConfig,
    subscriber: &str,
    recorded: Option<&RecordedDefinition>,
    running: Option<&(String, RecordedDefinition)>,
) -> Finding {
    let wanted = FoldDefinition::of(p, 1);
    let digest = wanted.digest();
    let name = &p.name;
    let Some(recorded) = recorded else {
        return Finding::ok(format!(
            "projection {name}: definition {} (recorded for {subscriber} at its next start)",
            short_digest(&digest)
        ));
    };
    if recorded.digest == digest {
        return Finding::ok(format!(
            "projection {name}: definition {} is the one {subscriber} folds with",
            short_digest(&digest)
        ));
    }
    if let Some((rebuilding, _)) = running.filter(|(_, d)| d.digest == digest) {
        return Finding::ok(format!(
            "projection {name}: definition {} is being rebuilt under {rebuilding}; {subscriber} serves the old one until the switch-over",
            short_digest(&digest)
        ));
    }
    let what = format!(
        "projection {name}: its definition changed since {subscriber} folded with it (- recorded, + config):\n{}",
        definition_diff(&recorded.text, &wanted.text())
    );
    match p.on_definition_change {
        OnDefinitionChange::Refuse => Finding::fail(
            what,
            "walfold run refuses it: set on_definition_change = \"rebuild\" (a blue/green rebuild starts by itself) or \"accept\" (compatible with the rows built so far), or undo the change",
        ),
        OnDefinitionChange::Accept => Finding::warn(
            what,
            "on_definition_change = \"accept\": the next start records it and folds on with it",
        ),
        OnDefinitionChange::Rebuild => Finding::warn(
            what,
            "on_definition_change = \"rebuild\": the next start rebuilds it under a new subscriber",
        ),
    }
}
