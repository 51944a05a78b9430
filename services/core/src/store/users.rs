//! Users and API tokens; tokens are stored as the SHA-256 of their secret.

use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};

use super::entities::{api_token, user};
use super::{Store, StoreResult};
use crate::auth::{IssuedToken, Principal, Scope, TokenVerifier, constant_time_eq, hash_secret, issue_token};
use crate::ids::{new_id, now_ms};

impl Store {
    /// Creates the first user, `admin`, with a token, when there is no user yet. Returns the
    /// token's text only when it was created now; it is never stored in clear.
    pub async fn bootstrap_admin(&self) -> StoreResult<Option<IssuedToken>> {
        if user::Entity::find().count(&self.db).await? > 0 {
            return Ok(None);
        }
        let admin = self.create_user("admin", true).await?;
        Ok(Some(self.create_token(&admin.id, "bootstrap", Scope::User).await?))
    }

    pub async fn create_user(&self, name: &str, is_admin: bool) -> StoreResult<user::Model> {
        let model = user::ActiveModel {
            id: Set(new_id()),
            name: Set(name.to_string()),
            is_admin: Set(is_admin),
            created_at_ms: Set(now_ms()),
        };
        let id = model.id.clone().unwrap();
        user::Entity::insert(model).exec_without_returning(&self.db).await?;
        Ok(user::Entity::find_by_id(id)
            .one(&self.db)
            .await?
            .expect("user just inserted"))
    }

    /// Issues a token for a user; the returned text is the only copy of the secret.
    pub async fn create_token(&self, user_id: &str, name: &str, scope: Scope) -> StoreResult<IssuedToken> {
        let issued = issue_token();
        api_token::Entity::insert(api_token::ActiveModel {
            id: Set(issued.id.clone()),
            user_id: Set(user_id.to_string()),
            secret_sha256: Set(issued.secret_sha256.clone()),
            name: Set(name.to_string()),
            scope: Set(scope.as_db()),
            revoked: Set(false),
            created_at_ms: Set(now_ms()),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(issued)
    }

    /// Revokes every token of a scope (a job's tokens when it ends).
    pub async fn revoke_tokens(&self, scope: &Scope) -> StoreResult<()> {
        api_token::Entity::update_many()
            .col_expr(api_token::Column::Revoked, sea_orm::sea_query::Expr::value(true))
            .filter(api_token::Column::Scope.eq(scope.as_db()))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Looks a token up; `None` when unknown, revoked or not matching.
    pub async fn verify_token(&self, token_id: &str, secret: &str) -> StoreResult<Option<Principal>> {
        let Some(token) = api_token::Entity::find_by_id(token_id.to_string())
            .one(&self.db)
            .await?
        else {
            return Ok(None);
        };
        if token.revoked || !constant_time_eq(&hash_secret(secret), &token.secret_sha256) {
            return Ok(None);
        }
        let Some(user) = user::Entity::find_by_id(token.user_id.clone()).one(&self.db).await? else {
            return Ok(None);
        };
        Ok(Some(Principal {
            user_id: user.id,
            user_name: user.name,
            is_admin: user.is_admin,
            scope: Scope::from_db(&token.scope),
        }))
    }
}

#[async_trait::async_trait]
impl TokenVerifier for Store {
    async fn verify(&self, token_id: &str, secret: &str) -> Result<Option<Principal>, String> {
        self.verify_token(token_id, secret).await.map_err(|e| e.to_string())
    }
}
