//! Login codes: the single-use URLs that sign a browser in to the web UI (`kiln ui`).
//!
//! A code is a token of [`Scope::Login`], valid for a minute and never accepted as a bearer
//! token. Redeeming it revokes it (once: two redemptions race for one conditional update) and
//! issues a session token of the same user, narrowed as the token that asked for the code was.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::entities::api_token;
use super::users::TokenGrant;
use super::{Store, StoreResult};
use crate::auth::{IssuedToken, Principal, Scope, constant_time_eq, hash_secret};
use crate::authz::Role;
use crate::ids::now_ms;

/// How long a login code is valid.
pub const LOGIN_CODE_TTL_MS: i64 = 60_000;

/// The name a session token made from a login code starts with (logging out revokes these).
pub const SESSION_TOKEN_PREFIX: &str = "ui-session-";

impl Store {
    /// Issues a login code for the caller, narrowed as the caller's token is.
    pub async fn issue_login_code(&self, caller: &Principal) -> StoreResult<IssuedToken> {
        let narrowed_to = self.narrowing_of(&caller.token_id).await?;
        self.insert_token(
            &caller.user_id,
            &format!("ui-login-{}", now_ms()),
            Scope::Login,
            Some(now_ms() + LOGIN_CODE_TTL_MS),
            narrowed_to,
        )
        .await
    }

    /// Redeems a login code: `None` when it is unknown, used, expired or not a login code;
    /// else a session token of its user, valid for `session_ms`.
    pub async fn redeem_login_code(
        &self,
        code_id: &str,
        secret: &str,
        session_ms: i64,
    ) -> StoreResult<Option<IssuedToken>> {
        let Some(code) = api_token::Entity::find_by_id(code_id.to_string()).one(&self.db).await? else {
            return Ok(None);
        };
        let now = now_ms();
        let live = !code.revoked && code.expires_at_ms.is_some_and(|at| at > now);
        if Scope::from_db(&code.scope) != Scope::Login
            || !live
            || !constant_time_eq(&hash_secret(secret), &code.secret_sha256)
        {
            return Ok(None);
        }
        let used = api_token::Entity::update_many()
            .col_expr(api_token::Column::Revoked, Expr::value(true))
            .filter(api_token::Column::Id.eq(code_id))
            .filter(api_token::Column::Revoked.eq(false))
            .exec(&self.db)
            .await?;
        if used.rows_affected != 1 {
            return Ok(None);
        }
        let grant = TokenGrant {
            name: format!("{SESSION_TOKEN_PREFIX}{now}-{}", &code.id[..code.id.len().min(8)]),
            expires_at_ms: Some(now + session_ms),
            narrowed_to: Role::parse(&code.role)
                .filter(|_| !code.project.is_empty())
                .map(|role| (code.project.clone(), role)),
        };
        Ok(Some(self.issue_user_token(&code.user_id, &grant).await?))
    }

    /// The project and role a token is narrowed to, if it is.
    async fn narrowing_of(&self, token_id: &str) -> StoreResult<Option<(String, Role)>> {
        let token = api_token::Entity::find_by_id(token_id.to_string())
            .one(&self.db)
            .await?;
        Ok(token.and_then(|token| {
            Role::parse(&token.role)
                .filter(|_| !token.project.is_empty())
                .map(|role| (token.project, role))
        }))
    }
}
