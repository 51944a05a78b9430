# The bucket of kiln's blobs (under `objects_prefix`: code bundles and datasets in artifacts/,
# job outputs in outputs/) and of the kiln release binaries the instances install at boot (under
# `releases/`). Encrypted with the kiln key, versioned, never public, reachable only over TLS.
variable "name" {
  description = "Bucket name prefix; AWS appends a unique suffix."
  type        = string
}

variable "kms_key_arn" {
  description = "The key objects are encrypted with (SSE-KMS, with an S3 bucket key)."
  type        = string
}

variable "noncurrent_version_days" {
  description = "Days an overwritten or deleted object's old version is kept."
  type        = number
}

resource "aws_s3_bucket" "this" {
  #checkov:skip=CKV_AWS_144: cross-region replication is a disaster-recovery choice of the operator (a second region and its costs), not a default of this module
  #checkov:skip=CKV_AWS_18: server access logs need a second bucket of the operator's choosing; record who reads what with CloudTrail S3 data events, an account-wide setting
  #checkov:skip=CKV2_AWS_62: nothing consumes S3 events; kiln learns of new blobs over its own RPCs
  bucket_prefix = "${var.name}-"
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket     = aws_s3_bucket.this.id
  depends_on = [aws_s3_bucket_versioning.this]

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  rule {
    id     = "expire-noncurrent-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_days
    }
  }
}

data "aws_iam_policy_document" "tls_only" {
  statement {
    sid     = "DenyWithoutTLS"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.this.arn,
      "${aws_s3_bucket.this.arn}/*",
    ]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket     = aws_s3_bucket.this.id
  policy     = data.aws_iam_policy_document.tls_only.json
  depends_on = [aws_s3_bucket_public_access_block.this]
}

output "bucket" {
  description = "The bucket's name."
  value       = aws_s3_bucket.this.bucket
}

output "arn" {
  description = "The bucket's ARN."
  value       = aws_s3_bucket.this.arn
}
