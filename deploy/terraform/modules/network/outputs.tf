output "vpc_id" {
  description = "The VPC's id."
  value       = aws_vpc.this.id
}

output "vpc_cidr" {
  description = "The VPC's IPv4 range."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "The private subnets, one per AZ, in AZ order."
  value       = aws_subnet.private[*].id
}

output "private_subnet_cidrs" {
  description = "The private subnets' ranges, in the order of private_subnet_ids."
  value       = aws_subnet.private[*].cidr_block
}

output "static_reservation_ids" {
  description = "The reservations of each private subnet's first two /26s (host numbers 4 to 127 are the address plan's)."
  value       = concat(aws_ec2_subnet_cidr_reservation.static[*].id, aws_ec2_subnet_cidr_reservation.static_second[*].id)
}

output "public_subnet_ids" {
  description = "The public subnets (NAT gateways only)."
  value       = aws_subnet.public[*].id
}
