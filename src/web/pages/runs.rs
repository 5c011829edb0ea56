//! The pages of a run (`/r/{id}`: one job's ranks) and of a comparison (`/compare/{a}/{b}`).
//! The server renders the names (escaped by askama); the numbers and curves come from the API
//! and are drawn by `static/js/run.js` and `static/js/compare.js`.

use askama::Template;
use axum::extract::State;
use axum::response::Html;

use super::{PageError, date, render};
use crate::web::AppState;
use crate::web::extract::Path;

#[derive(Template)]
#[template(path = "run.html")]
struct RunPage {
    id: String,
    name: String,
    date: String,
}

pub(crate) async fn run(State(app): State<AppState>, Path(id): Path<String>) -> Result<Html<String>, PageError> {
    let run = app.run(&id).await?;
    render(RunPage { id: run.id, name: run.key, date: date(run.created_at) })
}

#[derive(Template)]
#[template(path = "compare.html")]
struct ComparePage {
    a: String,
    b: String,
    a_name: String,
    b_name: String,
}

pub(crate) async fn compare(
    State(app): State<AppState>,
    Path((a, b)): Path<(String, String)>,
) -> Result<Html<String>, PageError> {
    let (ra, rb) = (app.row(&a).await?, app.row(&b).await?);
    render(ComparePage { a: ra.id, b: rb.id, a_name: ra.name, b_name: rb.name })
}
